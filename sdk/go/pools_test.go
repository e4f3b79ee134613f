package cubicle

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestSnapshotPoolMethods(t *testing.T) {
	d := newFakeDaemon(t)
	var put protocol.SetSnapshotPoolRequest
	d.mux.HandleFunc("PUT /v2/sandboxes/snapshots/{id}/pool", func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&put); err != nil {
			t.Error(err)
		}
		writeJSON(w, http.StatusOK, protocol.SnapshotPool{SnapshotID: r.PathValue("id"), Size: put.Size, MaxAgeSeconds: put.MaxAgeSeconds})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/snapshots/{id}/pool", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, protocol.SnapshotPool{SnapshotID: r.PathValue("id"), Size: 4, Ready: 2})
	})
	c, ctx := d.client(), context.Background()
	got, err := c.SetSnapshotPool(ctx, "base", 4, 300)
	if err != nil || got.SnapshotID != "base" || got.Size != 4 || got.MaxAgeSeconds != 300 || put.Size != 4 {
		t.Fatalf("SetSnapshotPool: %+v %v (sent %+v)", got, err, put)
	}
	if got, err := c.SnapshotPool(ctx, "base"); err != nil || got.Ready != 2 || got.Size != 4 {
		t.Fatalf("SnapshotPool: %+v %v", got, err)
	}
}

package cubicle

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestBuildSnapshot checks the build's fields travel as the query of a tar
// body and the build log is copied through.
func TestBuildSnapshot(t *testing.T) {
	d := newFakeDaemon(t)
	d.mux.HandleFunc("POST /v2/sandboxes/snapshots", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		q := r.URL.Query()
		if r.Header.Get("Content-Type") != "application/x-tar" || string(body) != "TAR" || q.Get("name") != "app" ||
			q.Get("target") != "final" || q.Get("no_cache") != "true" || strings.Join(q["build_arg"], ",") != "A=1,B=2" {
			t.Errorf("request: %s %q %v", r.Header.Get("Content-Type"), body, q)
		}
		writeJSON(w, http.StatusCreated, protocol.Snapshot{ID: "sn1", Name: "app", Status: protocol.SnapshotBuilding})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/snapshots/sn1/build-log", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "#1 [stage 1/1] FROM busybox\n")
	})
	c := d.client()
	ctx := context.Background()
	s, err := c.BuildSnapshot(ctx, protocol.BuildSnapshotRequest{Name: "app", Target: "final", NoCache: true,
		BuildArgs: map[string]string{"B": "2", "A": "1"}}, strings.NewReader("TAR"))
	if err != nil || s.ID != "sn1" || s.Status != protocol.SnapshotBuilding {
		t.Fatalf("BuildSnapshot = %+v, %v", s, err)
	}
	var log strings.Builder
	if err := c.FollowBuildLog(ctx, "sn1", &log); err != nil || log.String() != "#1 [stage 1/1] FROM busybox\n" {
		t.Fatalf("FollowBuildLog: %q, %v", log.String(), err)
	}
}

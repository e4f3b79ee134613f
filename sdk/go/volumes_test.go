package cubicle

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestVolumeMethods: each method calls its route with its body and
// decodes the answer; a 409 is a conflict.
func TestVolumeMethods(t *testing.T) {
	d := newFakeDaemon(t)
	var created protocol.CreateVolumeRequest
	d.mux.HandleFunc("POST /v2/sandboxes/volumes", func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&created); err != nil {
			t.Error(err)
		}
		writeJSON(w, http.StatusCreated, protocol.Volume{ID: "v1", Name: created.Name, SizeBytes: created.SizeBytes, FromSnapshot: created.FromSnapshot})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/volumes", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, protocol.VolumeList{Volumes: []protocol.Volume{{Name: "a"}, {Name: "b"}}})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/volumes/{name}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, protocol.Volume{Name: r.PathValue("name"), Attachments: []protocol.VolumeUse{{SandboxName: "box"}}})
	})
	d.mux.HandleFunc("DELETE /v2/sandboxes/volumes/{name}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusConflict, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "Conflict", Message: "attached"}})
	})
	var snap protocol.SnapshotVolumeRequest
	d.mux.HandleFunc("POST /v2/sandboxes/volumes/{name}/snapshot", func(w http.ResponseWriter, r *http.Request) {
		if err := json.NewDecoder(r.Body).Decode(&snap); err != nil {
			t.Error(err)
		}
		writeJSON(w, http.StatusCreated, protocol.VolumeSnapshot{Name: snap.Name, VolumeName: r.PathValue("name")})
	})
	d.mux.HandleFunc("GET /v2/sandboxes/volume-snapshots", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, protocol.VolumeSnapshotList{Snapshots: []protocol.VolumeSnapshot{{Name: "s"}}})
	})
	deleted := ""
	d.mux.HandleFunc("DELETE /v2/sandboxes/volume-snapshots/{name}", func(w http.ResponseWriter, r *http.Request) {
		deleted = r.PathValue("name")
		w.WriteHeader(http.StatusNoContent)
	})
	c, ctx := d.client(), context.Background()
	if v, err := c.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "data", FromSnapshot: "s"}); err != nil || v.Name != "data" || v.FromSnapshot != "s" || created.Name != "data" {
		t.Fatalf("CreateVolume: %+v %v (sent %+v)", v, err, created)
	}
	if l, err := c.ListVolumes(ctx); err != nil || len(l) != 2 {
		t.Fatalf("ListVolumes: %+v %v", l, err)
	}
	if v, err := c.GetVolume(ctx, "a b"); err != nil || v.Name != "a b" || len(v.Attachments) != 1 {
		t.Fatalf("GetVolume: %+v %v", v, err)
	}
	if err := c.DeleteVolume(ctx, "a"); !IsConflict(err) {
		t.Fatalf("DeleteVolume answered 409: %v", err)
	}
	if vs, err := c.SnapshotVolume(ctx, "data", "s1"); err != nil || vs.Name != "s1" || vs.VolumeName != "data" {
		t.Fatalf("SnapshotVolume: %+v %v", vs, err)
	}
	if l, err := c.ListVolumeSnapshots(ctx); err != nil || len(l) != 1 {
		t.Fatalf("ListVolumeSnapshots: %+v %v", l, err)
	}
	if err := c.DeleteVolumeSnapshot(ctx, "s1"); err != nil || deleted != "s1" {
		t.Fatalf("DeleteVolumeSnapshot: %v (deleted %q)", err, deleted)
	}
}

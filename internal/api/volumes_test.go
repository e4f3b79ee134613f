package api

import (
	"context"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newVolumeAPI serves a real manager over the sandboxtest fakes and a
// real store, with workspaces w1 (adminKey, memberKey) and w2 (otherKey),
// each with a snapshot its members may boot.
func newVolumeAPI(t *testing.T) *testAPI {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "layer")
	if err := os.MkdirAll(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, ws := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, store.Workspace{ID: ws, Name: ws, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		sn := &store.Snapshot{ID: "snap-" + ws, WorkspaceID: ws, CreatedBy: "ann", Name: "base", Status: protocol.SnapshotReady,
			Layers: []string{layer}, FSCapacityBytes: 1 << 30, CreatedAt: now, UpdatedAt: now}
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		if err := st.PutShare(ctx, &store.Share{ID: "share-" + ws, WorkspaceID: ws, ResourceKind: store.ShareSnapshot, ResourceID: sn.ID,
			Grantee: store.ShareWorkspace, Access: "use", CreatedBy: "ann", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	drv, err := sandboxtest.NewDriver()
	if err != nil {
		t.Fatal(err)
	}
	lim := sandbox.DefaultLimits
	lim.BootTimeout = 5 * time.Second
	mgr, err := sandbox.New(sandbox.Config{Store: st, Storage: sandboxtest.NewStorage(filepath.Join(dir, "storage")), Network: sandboxtest.NewNetwork(),
		Drivers: []runtime.Driver{drv}, AgentPort: drv.AgentPort, Limits: lim, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mgr.Close()
		if ids, err := drv.List(ctx); err == nil {
			for _, id := range ids {
				drv.Stop(ctx, id)
			}
		}
		st.Close()
	})
	ta := &testAPI{images: &fakeImages{}}
	ta.srv = New(mgr, quotaAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler))
	ta.srv.EnableVolumes(mgr)
	return ta
}

// TestVolumeRoutes: create, get, list, attach on create and PATCH, 409 on
// delete while attached, snapshot and clone, and the 422s naming the
// member at fault — through the HTTP API to the real manager.
func TestVolumeRoutes(t *testing.T) {
	ta := newVolumeAPI(t)
	const v = "/v2/sandboxes"
	expect := func(what string, code, want int, body any) {
		t.Helper()
		if code != want {
			t.Fatalf("%s: %d %v, want %d", what, code, body, want)
		}
	}
	code, body := ta.do(t, "POST", v+"/volumes", memberKey, map[string]any{"name": "data", "size_bytes": 8 << 20})
	expect("create", code, http.StatusCreated, body)
	if field(body, "size_bytes") != float64(8<<20) || field(body, "id") == "" {
		t.Fatalf("created volume: %v", body)
	}
	code, body = ta.do(t, "POST", v+"/boxes", memberKey, map[string]any{"name": "a", "snapshot_id": "base",
		"volumes": []any{map[string]any{"name": "data", "mount_path": "/data"}}})
	expect("create a sandbox with a volume", code, http.StatusCreated, body)
	vols, _ := field(body, "volumes").([]any)
	if len(vols) != 1 || field(vols[0], "name") != "data" || field(vols[0], "mount_path") != "/data" {
		t.Fatalf("sandbox's volumes: %v", body)
	}
	code, body = ta.do(t, "GET", v+"/volumes/data", memberKey, nil)
	expect("get", code, http.StatusOK, body)
	if uses, _ := field(body, "attachments").([]any); len(uses) != 1 || field(uses[0], "sandbox_name") != "a" {
		t.Fatalf("attachments: %v", body)
	}
	code, body = ta.do(t, "DELETE", v+"/volumes/data", memberKey, nil)
	expect("delete while attached", code, http.StatusConflict, body)

	for _, c := range []struct {
		path string
		body map[string]any
		loc  string
	}{
		{"/boxes", map[string]any{"name": "b", "snapshot_id": "base", "volumes": []any{map[string]any{"name": "nope", "mount_path": "/d"}}}, "body/volumes[0].name"},
		{"/boxes", map[string]any{"name": "b", "snapshot_id": "base", "volumes": []any{map[string]any{"name": "data", "mount_path": "rel"}}}, "body/volumes[0].mount_path"},
		{"/boxes", map[string]any{"name": "b", "snapshot_id": "base", "volumes": []any{map[string]any{"name": "data", "mount_path": "/sys/x"}}}, "body/volumes[0].mount_path"},
		{"/boxes", map[string]any{"name": "b", "snapshot_id": "base", "volumes": []any{map[string]any{"name": "data", "mount_path": "/d"},
			map[string]any{"name": "data", "mount_path": "/d"}}}, "body/volumes[1].mount_path"},
		{"/boxes", map[string]any{"name": "b", "snapshot_id": "base", "volumes": []any{map[string]any{"name": "data", "mount_path": "/d", "size": 1}}}, "body/volumes[0].size"},
		{"/volumes", map[string]any{"name": "x", "size_bytes": 5}, "body/size_bytes"},
		{"/volumes", map[string]any{"name": "x y", "size_bytes": 8 << 20}, "body/name"},
		{"/volumes", map[string]any{"name": "x", "from_snapshot": "nope"}, "body/from_snapshot"},
		{"/volumes/data/snapshot", map[string]any{"name": ""}, "body/name"},
	} {
		code, body := ta.do(t, "POST", v+c.path, memberKey, c.body)
		if loc, _ := validation(body); code != http.StatusUnprocessableEntity || loc != c.loc {
			t.Errorf("POST %s %v: %d %v, want 422 at %s", c.path, c.body, code, body, c.loc)
		}
	}
	code, body = ta.do(t, "PATCH", v+"/boxes/a", memberKey, map[string]any{"volumes": []any{map[string]any{"name": "nope", "mount_path": "/d"}}})
	if loc, _ := validation(body); code != http.StatusUnprocessableEntity || loc != "body/volumes[0].name" {
		t.Fatalf("PATCH with an unknown volume: %d %v", code, body)
	}

	// Tenancy: another workspace sees none of it, and cannot attach it.
	code, body = ta.do(t, "GET", v+"/volumes/data", otherKey, nil)
	expect("get from another workspace", code, http.StatusNotFound, body)
	code, body = ta.do(t, "DELETE", v+"/volumes/data", otherKey, nil)
	expect("delete from another workspace", code, http.StatusNotFound, body)
	code, body = ta.do(t, "GET", v+"/volumes", otherKey, nil)
	if list, _ := field(body, "volumes").([]any); code != http.StatusOK || len(list) != 0 {
		t.Fatalf("list from another workspace: %d %v", code, body)
	}
	code, body = ta.do(t, "POST", v+"/boxes", otherKey, map[string]any{"name": "b", "snapshot_id": "base",
		"volumes": []any{map[string]any{"name": "data", "mount_path": "/d"}}})
	if loc, _ := validation(body); code != http.StatusUnprocessableEntity || loc != "body/volumes[0].name" {
		t.Fatalf("attach another workspace's volume: %d %v", code, body)
	}

	code, body = ta.do(t, "POST", v+"/volumes/data/snapshot", memberKey, map[string]any{"name": "s1"})
	expect("snapshot", code, http.StatusCreated, body)
	code, body = ta.do(t, "POST", v+"/volumes", memberKey, map[string]any{"name": "copy", "from_snapshot": "s1"})
	expect("clone", code, http.StatusCreated, body)
	if field(body, "from_snapshot") == "" || field(body, "size_bytes") != float64(8<<20) {
		t.Fatalf("clone: %v", body)
	}
	code, body = ta.do(t, "GET", v+"/volume-snapshots", memberKey, nil)
	if list, _ := field(body, "snapshots").([]any); code != http.StatusOK || len(list) != 1 || field(list[0], "volume_name") != "data" {
		t.Fatalf("volume snapshots: %d %v", code, body)
	}
	code, body = ta.do(t, "DELETE", v+"/volume-snapshots/s1", memberKey, nil)
	expect("delete a volume snapshot", code, http.StatusNoContent, body)

	// Detach by PATCH, then the volume can go once the sandbox has too.
	code, body = ta.do(t, "PATCH", v+"/boxes/a", memberKey, map[string]any{"volumes": []any{}})
	expect("detach", code, http.StatusOK, body)
	if field(body, "volumes") != nil {
		t.Fatalf("volumes after detaching all: %v", body)
	}
	code, body = ta.do(t, "DELETE", v+"/volumes/data", memberKey, nil)
	expect("delete while a running instance mounts it", code, http.StatusConflict, body)
	code, body = ta.do(t, "DELETE", v+"/boxes/a", memberKey, nil)
	expect("delete the sandbox", code, http.StatusNoContent, body)
	code, body = ta.do(t, "DELETE", v+"/volumes/data", memberKey, nil)
	expect("delete", code, http.StatusNoContent, body)
	code, body = ta.do(t, "GET", v+"/volumes", memberKey, nil)
	if list, _ := field(body, "volumes").([]any); code != http.StatusOK || len(list) != 1 || field(list[0], "name") != "copy" {
		t.Fatalf("list: %d %v", code, body)
	}
}

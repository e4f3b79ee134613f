package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestBuiltinSnapshots: every workspace finds BuiltinWorkspace's
// snapshots by id and name, its own "default" first, a ready built-in
// before a building one; lists show them only WithBuiltin (and to every
// member); packages round-trip and survive an update that does not set
// them; the workspace itself is never listed or looked up.
func TestBuiltinSnapshots(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "db"))
	for _, ws := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: ws, Name: ws, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Now().UTC()
	put := func(id, ws, status string, packages map[string]string) *Snapshot {
		at = at.Add(time.Second)
		sn := &Snapshot{ID: id, WorkspaceID: ws, CreatedBy: "cubicle", Name: "default", Status: status, CreatedAt: at, UpdatedAt: at, Packages: packages}
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
		return sn
	}
	ready := put("b-ready", BuiltinWorkspace, protocol.SnapshotReady, map[string]string{"python3": "3.11"})
	put("b-building", BuiltinWorkspace, protocol.SnapshotBuilding, nil) // newer, but not ready

	for _, ws := range []string{"w1", "w2"} {
		if sn, err := st.SnapshotByName(ctx, ws, "default", ""); err != nil || sn.ID != ready.ID {
			t.Fatalf("%s: default = %v, %v; want the ready built-in", ws, sn, err)
		}
		sn, err := st.GetSnapshot(ctx, ws, ready.ID)
		if err != nil || sn.Packages["python3"] != "3.11" {
			t.Fatalf("%s: get built-in = %+v, %v; want it with its packages", ws, sn, err)
		}
	}
	sn, _ := st.GetSnapshot(ctx, "w1", ready.ID)
	sn.StatusMessage = "touched"
	sn.Packages = nil
	if err := st.UpdateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	if sn, _ := st.GetSnapshot(ctx, "w1", ready.ID); sn.Packages["python3"] != "3.11" {
		t.Fatalf("an update without packages dropped them: %v", sn.Packages)
	}

	own := put("w1-default", "w1", protocol.SnapshotReady, nil)
	if sn, err := st.SnapshotByName(ctx, "w1", "default", ""); err != nil || sn.ID != own.ID {
		t.Fatalf("w1 with its own default resolved %v, %v", sn, err)
	}
	if sn, err := st.SnapshotByName(ctx, "w2", "default", ""); err != nil || sn.ID != ready.ID {
		t.Fatalf("w2 resolved %v, %v; w1's own default must not reach it", sn, err)
	}
	if _, err := st.GetSnapshot(ctx, "w2", own.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("w2 got w1's snapshot: %v", err)
	}

	count := func(ws string, o ListOptions) int {
		l, err := st.ListSnapshots(ctx, ws, o)
		if err != nil {
			t.Fatal(err)
		}
		return len(l)
	}
	if n := count("w1", ListOptions{}); n != 1 {
		t.Errorf("w1 lists %d snapshots without WithBuiltin, want its own 1", n)
	}
	if n := count("w1", ListOptions{WithBuiltin: true}); n != 3 {
		t.Errorf("w1 lists %d snapshots WithBuiltin, want 3", n)
	}
	if n := count("w2", ListOptions{WithBuiltin: true, VisibleTo: "bob"}); n != 2 {
		t.Errorf("a member of w2 lists %d snapshots, want the 2 built-ins", n)
	}

	if _, err := st.GetWorkspace(ctx, BuiltinWorkspace); !errdefs.IsNotFound(err) {
		t.Errorf("GetWorkspace(builtin) = %v, want not found", err)
	}
	all, err := st.ListWorkspaces(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range all {
		if w.ID == BuiltinWorkspace {
			t.Errorf("ListWorkspaces shows the built-in workspace")
		}
	}
}

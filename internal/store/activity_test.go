package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestActivityPersistsAndNeverMovesBack checks last_active_at survives a
// reopen, is not overwritten by UpdateSandbox, and only moves forward even
// across fraction-of-a-second formatting differences.
func TestActivityPersistsAndNeverMovesBack(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sb := &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady, SnapshotID: "s",
		Runtime: "namespace", Token: "t", CreatedAt: now, UpdatedAt: now, ProxyConfig: []byte(`{"rules":[]}`)}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	t1 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC) // whole second: "…05Z" in RFC 3339
	t0 := t1.Add(-500 * time.Millisecond)             // "…04.5Z": sorts after "…05Z" as a plain RFC 3339 string
	if err := st.SetSandboxActivity(ctx, "b1", t1); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSandboxActivity(ctx, "b1", t0); err != nil {
		t.Fatal(err)
	}
	sb.Status = protocol.StatusStopped
	if err := st.UpdateSandbox(ctx, sb); err != nil { // sb.LastActiveAt is nil here
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	got, err := st.GetSandboxByID(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	if got.LastActiveAt == nil || !got.LastActiveAt.Equal(t1) {
		t.Fatalf("last_active_at %v, want %v", got.LastActiveAt, t1)
	}
	if string(got.ProxyConfig) != `{"rules":[]}` || got.Status != protocol.StatusStopped {
		t.Fatalf("record after reopen: %+v", got)
	}
}

func TestRegistryRecords(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	for _, w := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: w, Name: w, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	r := &Registry{ID: "r1", WorkspaceID: "w1", Name: "ghcr", URL: "ghcr.io", Username: "u", SealedPassword: []byte{1, 2, 3},
		CreatedAt: now, CreatedBy: "a", UpdatedAt: now, UpdatedBy: "a"}
	if err := st.CreateRegistry(ctx, r); err != nil {
		t.Fatal(err)
	}
	dup := *r
	dup.ID = "r2"
	if err := st.CreateRegistry(ctx, &dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate name: %v, want conflict", err)
	}
	dup.WorkspaceID = "w2" // names are per workspace
	if err := st.CreateRegistry(ctx, &dup); err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetRegistryByID(ctx, "w2", "r1"); !errdefs.IsNotFound(err) {
		t.Fatalf("other workspace's registry by id: %v, want not found", err)
	}
	r.Name, r.SealedPassword = "ghcr2", []byte{9}
	if err := st.UpdateRegistry(ctx, r); err != nil {
		t.Fatal(err)
	}
	got, err := st.GetRegistry(ctx, "w1", "ghcr2")
	if err != nil || string(got.SealedPassword) != "\x09" {
		t.Fatalf("after update: %+v %v", got, err)
	}
	list, err := st.ListRegistries(ctx, "w1", ListOptions{NameContains: "ghcr", Limit: 10})
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	if err := st.DeleteRegistry(ctx, "w1", "r1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteRegistry(ctx, "w1", "r1"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
}

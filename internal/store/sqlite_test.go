package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func openTest(t *testing.T, path string) *SQLite {
	t.Helper()
	st, err := OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestRecordsSurviveReopen checks records, their JSON fields and the
// schema version persist across a close and reopen (a daemon restart).
func TestRecordsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sn := &Snapshot{ID: "s1", WorkspaceID: "w", CreatedBy: "u", Name: "snap", Status: protocol.SnapshotReady,
		FSCapacityBytes: 1 << 30, Layers: []string{"/l/0", "/l/1"},
		RunConfig: protocol.RunConfig{User: "app", EnvVars: map[string]string{"A": "1"}}, CreatedAt: now, UpdatedAt: now}
	if err := st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	sb := &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady, SnapshotID: "s1",
		Runtime: "gvisor", VCPUs: 2, MemBytes: 1 << 30, Token: "tok", CreatedAt: now, UpdatedAt: now,
		RunConfig: &protocol.RunConfig{WorkDir: "/w"}}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	st.Close()

	st = openTest(t, path)
	gotSn, err := st.GetSnapshot(ctx, "w", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if len(gotSn.Layers) != 2 || gotSn.Layers[1] != "/l/1" || gotSn.RunConfig.User != "app" || gotSn.RunConfig.EnvVars["A"] != "1" {
		t.Fatalf("snapshot after reopen: %+v", gotSn)
	}
	gotSb, err := st.GetSandbox(ctx, "w", "box")
	if err != nil {
		t.Fatal(err)
	}
	if gotSb.ID != "b1" || gotSb.RunConfig == nil || gotSb.RunConfig.WorkDir != "/w" || gotSb.StoppedAt != nil || !gotSb.CreatedAt.Equal(now) {
		t.Fatalf("sandbox after reopen: %+v", gotSb)
	}
	if n, _ := st.CountSandboxesUsingSnapshot(ctx, "s1"); n != 1 {
		t.Fatalf("sandboxes using s1: %d", n)
	}
}

// TestNamesAndScoping checks unique names per workspace, workspace scoping
// and the typed errors the API maps to 404 and 409.
func TestNamesAndScoping(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now()
	for _, w := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: w, Name: w, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(id, ws, name string) error {
		return st.CreateSandbox(ctx, &Sandbox{ID: id, WorkspaceID: ws, CreatedBy: "u", Name: name, Status: protocol.StatusReady,
			SnapshotID: "s", Runtime: "namespace", Token: "t", CreatedAt: now, UpdatedAt: now})
	}
	if err := mk("a", "w1", "same"); err != nil {
		t.Fatal(err)
	}
	if err := mk("b", "w2", "same"); err != nil {
		t.Fatalf("same name in another workspace: %v", err)
	}
	if err := mk("c", "w1", "same"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate name: %v, want ErrConflict", err)
	}
	if _, err := st.GetSandbox(ctx, "w2", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing sandbox: %v, want ErrNotFound", err)
	}
	got, err := st.GetSandbox(ctx, "w2", "same")
	if err != nil || got.ID != "b" {
		t.Fatalf("workspace scoping: %+v %v", got, err)
	}
	list, err := st.ListSandboxes(ctx, "w1", ListOptions{NameContains: "am", Limit: 10})
	if err != nil || len(list) != 1 || list[0].ID != "a" {
		t.Fatalf("list w1: %v %v", list, err)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k", WorkspaceID: "w1", User: "u", Role: RoleAdmin, Hash: "h", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k2", WorkspaceID: "w1", User: "u", Role: RoleAdmin, Hash: "h", CreatedAt: now}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate key hash: %v", err)
	}
	if _, err := st.APIKeyByHash(ctx, "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}
}

// The creator filter applies before paging: a user's page is full of
// their own records, and the next offset continues among them only.
func TestListSandboxesCreatedByPagesAfterFilter(t *testing.T) {
	st := openTest(t, filepath.Join(t.TempDir(), "db"))
	ctx := context.Background()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	base := time.Now().UTC().Add(-time.Hour)
	for i := range 30 {
		who := "a"
		if i%3 == 0 {
			who = "b"
		}
		sb := &Sandbox{ID: fmt.Sprintf("id-%02d", i), WorkspaceID: "w", CreatedBy: who, Name: fmt.Sprintf("n-%02d", i),
			Status: "stopped", Token: "t", CreatedAt: base.Add(time.Duration(i) * time.Second), UpdatedAt: base}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	for off := 0; ; off += 4 {
		page, err := st.ListSandboxes(ctx, "w", ListOptions{CreatedBy: "b", Limit: 4, Offset: off})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range page {
			if sb.CreatedBy != "b" {
				t.Fatalf("filter let %s's %s through", sb.CreatedBy, sb.Name)
			}
			seen = append(seen, sb.Name)
		}
		if len(page) < 4 {
			break
		}
	}
	if len(seen) != 10 {
		t.Fatalf("paged through %d of b's 10 sandboxes: %v", len(seen), seen)
	}
}

// TestPreserveMemoryOnStopPersists checks the flag is stored on create,
// rewritten by UpdateSandbox and read back after a reopen.
func TestPreserveMemoryOnStopPersists(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	sb := &Sandbox{ID: "b1", WorkspaceID: "w", CreatedBy: "u", Name: "box", Status: protocol.StatusReady,
		Token: "tok", CreatedAt: now, UpdatedAt: now, PreserveMemoryOnStop: true}
	if err := st.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, err := st.GetSandboxByID(ctx, "b1"); err != nil || !got.PreserveMemoryOnStop {
		t.Fatalf("after create: %+v, %v", got, err)
	}
	sb.PreserveMemoryOnStop = false
	if err := st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	if got, err := st.GetSandboxByID(ctx, "b1"); err != nil || got.PreserveMemoryOnStop {
		t.Fatalf("after update and reopen: %+v, %v", got, err)
	}
}

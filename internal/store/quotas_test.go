package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestQuotas checks quotas default to unlimited, are replaced whole
// (nil clears a ceiling), survive a reopen, and that an unknown workspace
// is not found.
func TestQuotas(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if q, err := st.GetQuota(ctx, "w"); err != nil || q != (Quota{}) {
		t.Fatalf("default quota: %+v %v", q, err)
	}
	five, big := int64(5), int64(1<<40)
	if err := st.PutQuota(ctx, "w", Quota{MaxSandboxes: &five, MaxStorageBytes: &big}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutQuota(ctx, "w", Quota{MaxSandboxes: &five, MaxSnapshots: &five}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	q, err := st.GetQuota(ctx, "w")
	if err != nil || q.MaxSandboxes == nil || *q.MaxSandboxes != 5 || q.MaxSnapshots == nil || *q.MaxSnapshots != 5 ||
		q.MaxStorageBytes != nil || q.MaxVCPUs != nil || q.MaxMemBytes != nil {
		t.Fatalf("quota after replace and reopen: %+v %v", q, err)
	}
	if _, err := st.GetQuota(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get quota of unknown workspace: %v", err)
	}
	if err := st.PutQuota(ctx, "nope", q); !errdefs.IsNotFound(err) {
		t.Fatalf("put quota of unknown workspace: %v", err)
	}
}

// TestWorkspaceUsage checks what each usage figure counts: every
// sandbox but deleting ones, CPU and memory of running ones only, declared
// capacity, and every snapshot; other workspaces never count.
func TestWorkspaceUsage(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	for _, ws := range []string{"w", "other"} {
		if err := st.EnsureWorkspace(ctx, Workspace{ID: ws, Name: ws, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := st.CreateSnapshot(ctx, &Snapshot{ID: "sn-" + ws, WorkspaceID: ws, Name: "s", Status: protocol.SnapshotReady, CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	for i, b := range []struct{ ws, status string }{
		{"w", protocol.StatusReady}, {"w", protocol.StatusProvisioning}, {"w", protocol.StatusStopped},
		{"w", protocol.StatusFailed}, {"w", protocol.StatusDeleting}, {"other", protocol.StatusReady},
	} {
		sb := &Sandbox{ID: string(rune('a' + i)), WorkspaceID: b.ws, Name: string(rune('a' + i)), Status: b.status, SnapshotID: "sn-" + b.ws,
			VCPUs: 1 << i, MemBytes: 10 << i, FSCapacityBytes: 100 << i, CreatedAt: now, UpdatedAt: now}
		if err := st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	u, err := st.WorkspaceUsage(ctx, "w")
	want := Usage{Sandboxes: 4, VCPUs: 1 + 2, MemBytes: 10 + 20, StorageBytes: 100 + 200 + 400 + 800, Snapshots: 1}
	if err != nil || u != want {
		t.Fatalf("usage = %+v, %v; want %+v", u, err, want)
	}
	if u, err := st.WorkspaceUsage(ctx, "empty"); err != nil || u != (Usage{}) {
		t.Fatalf("usage of an empty workspace: %+v %v", u, err)
	}
}

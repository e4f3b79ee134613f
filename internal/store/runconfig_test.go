package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestRunConfigStoredOnce: many snapshots of one large run config store it
// once; lists carry none of it; a get returns it whole; deleting the last
// snapshot drops it.
func TestRunConfigStoredOnce(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	big := protocol.RunConfig{EnvVars: map[string]string{"BIG": strings.Repeat("x", 1<<20)}}
	for i := range 20 {
		sn := &Snapshot{ID: fmt.Sprint("s", i), WorkspaceID: "w", CreatedBy: "u", Name: fmt.Sprint("n", i), Status: protocol.SnapshotReady,
			FSCapacityBytes: 1, Layers: []string{"/l/shared", fmt.Sprint("/l/", i)}, RunConfig: big, CreatedAt: now, UpdatedAt: now}
		if err := st.CreateSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	var rows int
	if err := st.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM run_configs`).Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("run_configs rows = %d, %v; want 1", rows, err)
	}
	if _, err := st.db.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() > 4<<20 {
		t.Errorf("database of 20 snapshots sharing a 1 MiB run config is %d bytes (%v)", fi.Size(), err)
	}
	list, err := st.ListSnapshots(ctx, "w", ListOptions{})
	if err != nil || len(list) != 20 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	for _, sn := range list {
		if len(sn.RunConfig.EnvVars) != 0 {
			t.Fatalf("listed snapshot %s carries its run config", sn.ID)
		}
	}
	got, err := st.GetSnapshot(ctx, "w", "s3")
	if err != nil || len(got.RunConfig.EnvVars["BIG"]) != 1<<20 {
		t.Fatalf("get: %v", err)
	}
	if layers, err := st.LayersInUse(ctx); err != nil || len(layers) != 21 {
		t.Errorf("LayersInUse = %d layers, %v; want 21 distinct", len(layers), err)
	}
	for i := range 20 {
		if err := st.DeleteSnapshot(ctx, "w", fmt.Sprint("s", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM run_configs`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("run_configs rows after deleting every snapshot = %d, %v; want 0", rows, err)
	}
}

// TestInlineRunConfigSurvivesMigration: a snapshot written before run
// configs were stored apart keeps its run config.
func TestInlineRunConfigSurvivesMigration(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	db := openAtVersion(t, path, 4)
	for _, q := range []string{`INSERT INTO workspaces(id, name, created_at) VALUES('w','w','2026-01-01T00:00:00Z')`,
		`INSERT INTO snapshots(id, workspace_id, created_by, name, status, fs_capacity_bytes, run_config, created_at, updated_at)
			VALUES('old','w','u','old','ready',1,'{"user":"legacy"}','2026-01-01T00:00:00Z','2026-01-01T00:00:00Z')`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	st := openTest(t, path)
	got, err := st.GetSnapshot(ctx, "w", "old")
	if err != nil || got.RunConfig.User != "legacy" {
		t.Fatalf("migrated snapshot: %+v, %v", got, err)
	}
}

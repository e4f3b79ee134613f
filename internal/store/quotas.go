package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Quota is a workspace's ceilings; a nil field is unlimited.
type Quota struct {
	MaxSandboxes    *int64
	MaxVCPUs        *int64
	MaxMemBytes     *int64
	MaxStorageBytes *int64
	MaxSnapshots    *int64
}

// Usage is what a workspace holds, measured against its Quota:
//   - Sandboxes counts every sandbox record not being deleted (running,
//     stopped, provisioning, failed);
//   - VCPUs and MemBytes sum the running ones (provisioning or ready), the
//     statuses that hold CPU and memory;
//   - StorageBytes sums the declared fs_capacity_bytes of the sandboxes
//     counted in Sandboxes and the size_bytes of the workspace's volumes
//     (declared, not measured: either may grow to its size at any time);
//   - Snapshots counts every snapshot record (building, ready or failed)
//     and every volume snapshot.
type Usage struct {
	Sandboxes    int64
	VCPUs        int64
	MemBytes     int64
	StorageBytes int64
	Snapshots    int64
}

// GetQuota returns workspaceID's quotas.
func (s *SQLite) GetQuota(ctx context.Context, workspaceID string) (Quota, error) {
	var q Quota
	var cols [5]sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT q.max_sandboxes, q.max_vcpus, q.max_mem_bytes, q.max_storage_bytes, q.max_snapshots
		FROM workspaces w LEFT JOIN quotas q ON q.workspace_id = w.id WHERE w.id=?`, workspaceID).
		Scan(&cols[0], &cols[1], &cols[2], &cols[3], &cols[4])
	if errors.Is(err, sql.ErrNoRows) {
		return q, fmt.Errorf("workspace %s: %w", workspaceID, errdefs.ErrNotFound)
	}
	if err != nil {
		return q, fmt.Errorf("get quotas of workspace %s: %w", workspaceID, err)
	}
	for i, dst := range []**int64{&q.MaxSandboxes, &q.MaxVCPUs, &q.MaxMemBytes, &q.MaxStorageBytes, &q.MaxSnapshots} {
		if cols[i].Valid {
			v := cols[i].Int64
			*dst = &v
		}
	}
	return q, nil
}

// PutQuota replaces workspaceID's quotas; an unknown workspace is
// ErrNotFound.
func (s *SQLite) PutQuota(ctx context.Context, workspaceID string, q Quota) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO quotas(workspace_id, max_sandboxes, max_vcpus, max_mem_bytes, max_storage_bytes, max_snapshots)
		VALUES(?,?,?,?,?,?) ON CONFLICT(workspace_id) DO UPDATE SET max_sandboxes=excluded.max_sandboxes, max_vcpus=excluded.max_vcpus,
		max_mem_bytes=excluded.max_mem_bytes, max_storage_bytes=excluded.max_storage_bytes, max_snapshots=excluded.max_snapshots`,
		workspaceID, nullInt(q.MaxSandboxes), nullInt(q.MaxVCPUs), nullInt(q.MaxMemBytes), nullInt(q.MaxStorageBytes), nullInt(q.MaxSnapshots))
	if isForeignKey(err) {
		return fmt.Errorf("workspace %s: %w", workspaceID, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("put quotas of workspace %s: %w", workspaceID, err)
	}
	return nil
}

func nullInt(v *int64) any {
	if v == nil {
		return nil
	}
	return *v
}

// WorkspaceUsage measures workspaceID's usage in one query.
func (s *SQLite) WorkspaceUsage(ctx context.Context, workspaceID string) (Usage, error) {
	var u Usage
	err := s.db.QueryRowContext(ctx, `SELECT
		COUNT(*),
		COALESCE(SUM(CASE WHEN status IN (?,?) THEN vcpus END), 0),
		COALESCE(SUM(CASE WHEN status IN (?,?) THEN mem_bytes END), 0),
		COALESCE(SUM(fs_capacity_bytes), 0) + (SELECT COALESCE(SUM(size_bytes), 0) FROM volumes WHERE workspace_id=?),
		(SELECT COUNT(*) FROM snapshots WHERE workspace_id=?) + (SELECT COUNT(*) FROM volume_snapshots WHERE workspace_id=?)
		FROM sandboxes WHERE workspace_id=? AND status != ?`,
		protocol.StatusProvisioning, protocol.StatusReady, protocol.StatusProvisioning, protocol.StatusReady,
		workspaceID, workspaceID, workspaceID, workspaceID, protocol.StatusDeleting).
		Scan(&u.Sandboxes, &u.VCPUs, &u.MemBytes, &u.StorageBytes, &u.Snapshots)
	if err != nil {
		return u, fmt.Errorf("measure usage of workspace %s: %w", workspaceID, err)
	}
	return u, nil
}

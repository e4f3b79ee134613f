package store

import (
	"context"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// SetSandboxSnapshot re-points sandbox id at snapshot snapshotID.
func (s *SQLite) SetSandboxSnapshot(ctx context.Context, id, snapshotID string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET snapshot_id=?, updated_at=? WHERE id=?`,
		snapshotID, fmtTime(time.Now()), id)
	if err != nil {
		return fmt.Errorf("set snapshot of sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

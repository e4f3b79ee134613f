package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

const shareCols = `id, workspace_id, resource_kind, resource_id, grantee, access, created_by, created_at`

func scanShare(row scanner) (*Share, error) {
	var sh Share
	var created string
	if err := row.Scan(&sh.ID, &sh.WorkspaceID, &sh.ResourceKind, &sh.ResourceID, &sh.Grantee, &sh.Access, &sh.CreatedBy, &created); err != nil {
		return nil, err
	}
	sh.CreatedAt = parseTime(created)
	return &sh, nil
}

// PutShare inserts sh or updates the access of the resource's existing
// share with the same grantee, and reads back what is stored.
func (s *SQLite) PutShare(ctx context.Context, sh *Share) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO shares(`+shareCols+`) VALUES(?,?,?,?,?,?,?,?)
		ON CONFLICT(resource_kind, resource_id, grantee) DO UPDATE SET access=excluded.access`,
		sh.ID, sh.WorkspaceID, sh.ResourceKind, sh.ResourceID, sh.Grantee, sh.Access, sh.CreatedBy, fmtTime(sh.CreatedAt))
	if err != nil {
		return fmt.Errorf("share %s %s with %s: %w", sh.ResourceKind, sh.ResourceID, sh.Grantee, err)
	}
	got, err := queryOne(ctx, s.db, "share", scanShare, sh.Grantee, `SELECT `+shareCols+` FROM shares WHERE resource_kind=? AND resource_id=? AND grantee=?`,
		sh.ResourceKind, sh.ResourceID, sh.Grantee)
	if err != nil {
		return err
	}
	*sh = *got
	return nil
}

// ListShares lists a resource's shares, oldest first.
func (s *SQLite) ListShares(ctx context.Context, kind, resourceID string) ([]*Share, error) {
	return queryAll(ctx, s.db, "shares", scanShare, `SELECT `+shareCols+` FROM shares WHERE resource_kind=? AND resource_id=? ORDER BY created_at, id`, kind, resourceID)
}

// DeleteShare removes share id of a resource.
func (s *SQLite) DeleteShare(ctx context.Context, kind, resourceID, id string) (*Share, error) {
	sh, err := queryOne(ctx, s.db, "share", scanShare, id, `DELETE FROM shares WHERE resource_kind=? AND resource_id=? AND id=? RETURNING `+shareCols, kind, resourceID, id)
	if err != nil {
		return nil, err
	}
	return sh, nil
}

// SharedAccess returns the best access user holds on a resource through
// shares ("use" beats "read"; "" for none).
func (s *SQLite) SharedAccess(ctx context.Context, kind, resourceID, user string) (string, error) {
	var access sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT MAX(access) FROM shares WHERE resource_kind=? AND resource_id=? AND grantee IN (?, '*')`,
		kind, resourceID, user).Scan(&access)
	if err != nil {
		return "", fmt.Errorf("shared access of %s to %s %s: %w", user, kind, resourceID, err)
	}
	return access.String, nil // MAX works: "use" > "read"
}

// UserInWorkspace reports whether user is a (not deleted) user of
// workspaceID.
func (s *SQLite) UserInWorkspace(ctx context.Context, workspaceID, user string) (bool, error) {
	var one int
	err := s.db.QueryRowContext(ctx, `SELECT 1 FROM users WHERE workspace_id=? AND id=? AND deleted_at IS NULL`, workspaceID, user).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up user %s: %w", user, err)
	}
	return true, nil
}

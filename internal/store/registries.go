package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

const registryCols = `id, workspace_id, name, url, username, sealed_password, created_at, created_by, updated_at, updated_by`

// CreateRegistry inserts a registry record; a name clash in its workspace
// wraps ErrConflict.
func (s *SQLite) CreateRegistry(ctx context.Context, r *Registry) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO registries(`+registryCols+`) VALUES(?,?,?,?,?,?,?,?,?,?)`,
		r.ID, r.WorkspaceID, r.Name, r.URL, r.Username, r.SealedPassword,
		fmtTime(r.CreatedAt), r.CreatedBy, fmtTime(r.UpdatedAt), r.UpdatedBy)
	if isUnique(err) {
		return fmt.Errorf("registry name %q: %w", r.Name, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert registry %s: %w", r.ID, err)
	}
	return nil
}

// UpdateRegistry rewrites the mutable fields of a registry record.
func (s *SQLite) UpdateRegistry(ctx context.Context, r *Registry) error {
	res, err := s.db.ExecContext(ctx, `UPDATE registries SET name=?, url=?, username=?, sealed_password=?, updated_at=?, updated_by=?
		WHERE workspace_id=? AND id=?`,
		r.Name, r.URL, r.Username, r.SealedPassword, fmtTime(r.UpdatedAt), r.UpdatedBy, r.WorkspaceID, r.ID)
	if isUnique(err) {
		return fmt.Errorf("registry name %q: %w", r.Name, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("update registry %s: %w", r.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("registry %s: %w", r.ID, errdefs.ErrNotFound)
	}
	return nil
}

func scanRegistry(row scanner) (*Registry, error) {
	var r Registry
	var created, updated string
	if err := row.Scan(&r.ID, &r.WorkspaceID, &r.Name, &r.URL, &r.Username, &r.SealedPassword,
		&created, &r.CreatedBy, &updated, &r.UpdatedBy); err != nil {
		return nil, err
	}
	r.CreatedAt, r.UpdatedAt = parseTime(created), parseTime(updated)
	return &r, nil
}

func (s *SQLite) oneRegistry(ctx context.Context, what, query string, args ...any) (*Registry, error) {
	r, err := scanRegistry(s.db.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("registry %s: %w", what, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get registry %s: %w", what, err)
	}
	return r, nil
}

// GetRegistry returns the registry called name in workspaceID.
func (s *SQLite) GetRegistry(ctx context.Context, workspaceID, name string) (*Registry, error) {
	return s.oneRegistry(ctx, name, `SELECT `+registryCols+` FROM registries WHERE workspace_id=? AND name=?`, workspaceID, name)
}

// GetRegistryByID returns the registry with id in workspaceID.
func (s *SQLite) GetRegistryByID(ctx context.Context, workspaceID, id string) (*Registry, error) {
	return s.oneRegistry(ctx, id, `SELECT `+registryCols+` FROM registries WHERE workspace_id=? AND id=?`, workspaceID, id)
}

// ListRegistries lists a workspace's registries, oldest first.
func (s *SQLite) ListRegistries(ctx context.Context, workspaceID string, o ListOptions) ([]*Registry, error) {
	clause, args, err := listClause("registries", o)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+registryCols+` FROM registries WHERE workspace_id=?`+clause, append([]any{workspaceID}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("list registries: %w", err)
	}
	defer rows.Close()
	var out []*Registry
	for rows.Next() {
		r, err := scanRegistry(rows)
		if err != nil {
			return nil, fmt.Errorf("list registries: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteRegistry removes a registry record.
func (s *SQLite) DeleteRegistry(ctx context.Context, workspaceID, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM registries WHERE workspace_id=? AND id=?`, workspaceID, id)
	if err != nil {
		return fmt.Errorf("delete registry %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("registry %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// nullTimeValue scans a nullable time column.
func nullTimeValue(v sql.NullString) *time.Time {
	if !v.Valid {
		return nil
	}
	t := parseTime(v.String)
	return &t
}

const apiKeyCols = `id, workspace_id, user, role, hash, created_at, name, prefix, expires_at, revoked_at, instance_admin`

func scanAPIKey(row scanner) (*APIKey, error) {
	var k APIKey
	var created string
	var expires, revoked sql.NullString
	if err := row.Scan(&k.ID, &k.WorkspaceID, &k.User, &k.Role, &k.Hash, &created, &k.Name, &k.Prefix,
		&expires, &revoked, &k.InstanceAdmin); err != nil {
		return nil, err
	}
	k.CreatedAt, k.ExpiresAt, k.RevokedAt = parseTime(created), nullTimeValue(expires), nullTimeValue(revoked)
	return &k, nil
}

// PutAPIKey stores a key record. Its user is created in the key's
// workspace (named by its id) if it does not exist yet, so every key has
// a user row; a deleted user gets no new keys (ErrNotFound).
func (s *SQLite) PutAPIKey(ctx context.Context, k APIKey) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO users(id, workspace_id, name, created_at) VALUES(?,?,?,?)`,
			k.User, k.WorkspaceID, k.User, fmtTime(k.CreatedAt)); err != nil {
			return fmt.Errorf("insert user of api key: %w", err)
		}
		var deleted sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT deleted_at FROM users WHERE workspace_id=? AND id=?`, k.WorkspaceID, k.User).
			Scan(&deleted); err != nil {
			return fmt.Errorf("read user of api key: %w", err)
		}
		if deleted.Valid {
			return fmt.Errorf("user %s: %w", k.User, errdefs.ErrNotFound)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys(`+apiKeyCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?)`,
			k.ID, k.WorkspaceID, k.User, k.Role, k.Hash, fmtTime(k.CreatedAt), k.Name, k.Prefix,
			nullTime(k.ExpiresAt), nullTime(k.RevokedAt), k.InstanceAdmin)
		if isUnique(err) {
			return fmt.Errorf("insert api key: %w", errdefs.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("insert api key: %w", err)
		}
		return nil
	})
}

// APIKeyByHash finds the key whose secret hashes to hash (through the
// unique index on hash), revoked or expired ones included: the caller
// decides what they mean.
func (s *SQLite) APIKeyByHash(ctx context.Context, hash string) (*APIKey, error) {
	return queryOne(ctx, s.db, "api key", scanAPIKey, "", `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ?`, hash)
}

// CountAPIKeys counts stored keys (zero means a fresh install).
func (s *SQLite) CountAPIKeys(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count api keys: %w", err)
	}
	return n, nil
}

// GetAPIKey returns key id of workspaceID.
func (s *SQLite) GetAPIKey(ctx context.Context, workspaceID, id string) (*APIKey, error) {
	return queryOne(ctx, s.db, "api key", scanAPIKey, id, `SELECT `+apiKeyCols+` FROM api_keys WHERE workspace_id=? AND id=?`, workspaceID, id)
}

// ListAPIKeys lists workspaceID's keys (of user, if set), oldest first.
func (s *SQLite) ListAPIKeys(ctx context.Context, workspaceID, user string) ([]*APIKey, error) {
	return queryAll(ctx, s.db, "api keys", scanAPIKey, `SELECT `+apiKeyCols+` FROM api_keys
		WHERE workspace_id=? AND (?='' OR user=?) ORDER BY created_at, id`, workspaceID, user, user)
}

// RevokeAPIKey marks key id revoked; revoking twice keeps the first time.
func (s *SQLite) RevokeAPIKey(ctx context.Context, workspaceID, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at=COALESCE(revoked_at, ?) WHERE workspace_id=? AND id=?`,
		fmtTime(at), workspaceID, id)
	if err != nil {
		return fmt.Errorf("revoke api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("api key %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

func scanWorkspace(row scanner) (*Workspace, error) {
	var w Workspace
	var created string
	if err := row.Scan(&w.ID, &w.Name, &created); err != nil {
		return nil, err
	}
	w.CreatedAt = parseTime(created)
	return &w, nil
}

// EnsureWorkspace inserts w unless a workspace with its id exists.
func (s *SQLite) EnsureWorkspace(ctx context.Context, w Workspace) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR IGNORE INTO workspaces(id, name, created_at) VALUES(?,?,?)`,
		w.ID, w.Name, fmtTime(w.CreatedAt))
	if err != nil {
		return fmt.Errorf("insert workspace %s: %w", w.ID, err)
	}
	return nil
}

// CreateWorkspace inserts w unless its id or name is taken (ErrConflict).
// Names are checked here rather than by an index so that a database from
// before this rule, with duplicate names, still migrates.
func (s *SQLite) CreateWorkspace(ctx context.Context, w Workspace) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM workspaces WHERE name=? OR id=?`, w.Name, w.ID).Scan(&n); err != nil {
			return fmt.Errorf("check workspace name: %w", err)
		}
		if n > 0 {
			return fmt.Errorf("workspace name %q: %w", w.Name, errdefs.ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO workspaces(id, name, created_at) VALUES(?,?,?)`,
			w.ID, w.Name, fmtTime(w.CreatedAt)); err != nil {
			return fmt.Errorf("insert workspace %s: %w", w.ID, err)
		}
		return nil
	})
}

// GetWorkspace returns the workspace whose id, else whose name, is ref
// (never BuiltinWorkspace).
func (s *SQLite) GetWorkspace(ctx context.Context, ref string) (*Workspace, error) {
	return queryOne(ctx, s.db, "workspace", scanWorkspace, ref,
		`SELECT id, name, created_at FROM workspaces WHERE (id=? OR name=?) AND id<>? ORDER BY id=? DESC, created_at LIMIT 1`, ref, ref, BuiltinWorkspace, ref)
}

// ListWorkspaces lists every workspace but BuiltinWorkspace, oldest first.
func (s *SQLite) ListWorkspaces(ctx context.Context) ([]*Workspace, error) {
	return queryAll(ctx, s.db, "workspaces", scanWorkspace, `SELECT id, name, created_at FROM workspaces WHERE id<>? ORDER BY created_at, id`, BuiltinWorkspace)
}

// DeleteWorkspace removes workspace id, its users, keys and registries,
// in one transaction, unless something still lives in it.
func (s *SQLite) DeleteWorkspace(ctx context.Context, id string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var sandboxes, snapshots, volumes, admins int
		err := tx.QueryRowContext(ctx, `SELECT
			(SELECT COUNT(*) FROM sandboxes WHERE workspace_id=?),
			(SELECT COUNT(*) FROM snapshots WHERE workspace_id=?),
			(SELECT COUNT(*) FROM volumes WHERE workspace_id=?) + (SELECT COUNT(*) FROM volume_snapshots WHERE workspace_id=?),
			(SELECT COUNT(*) FROM api_keys WHERE workspace_id=? AND instance_admin=1)`, id, id, id, id, id).Scan(&sandboxes, &snapshots, &volumes, &admins)
		if err != nil {
			return fmt.Errorf("count what workspace %s holds: %w", id, err)
		}
		switch {
		case sandboxes > 0 || snapshots > 0:
			return fmt.Errorf("workspace %s still has %d sandboxes and %d snapshots: %w", id, sandboxes, snapshots, errdefs.ErrConflict)
		case volumes > 0:
			return fmt.Errorf("workspace %s still has %d volumes and volume snapshots: %w", id, volumes, errdefs.ErrConflict)
		case admins > 0:
			return fmt.Errorf("workspace %s holds the instance admin key: %w", id, errdefs.ErrConflict)
		}
		for _, table := range []string{"shares", "api_keys", "users", "registries", "quotas"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE workspace_id=?`, id); err != nil {
				return fmt.Errorf("delete %s of workspace %s: %w", table, id, err)
			}
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM workspaces WHERE id=?`, id)
		if err != nil {
			return fmt.Errorf("delete workspace %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("workspace %s: %w", id, errdefs.ErrNotFound)
		}
		return nil
	})
}

const userCols = `id, workspace_id, name, COALESCE(email, ''), created_at, deleted_at`

func scanUser(row scanner) (*User, error) {
	var u User
	var created string
	var deleted sql.NullString
	if err := row.Scan(&u.ID, &u.WorkspaceID, &u.Name, &u.Email, &created, &deleted); err != nil {
		return nil, err
	}
	u.CreatedAt, u.DeletedAt = parseTime(created), nullTimeValue(deleted)
	return &u, nil
}

// CreateUser inserts u; an id already used in its workspace wraps
// ErrConflict.
func (s *SQLite) CreateUser(ctx context.Context, u *User) error {
	email := any(nil)
	if u.Email != "" {
		email = u.Email
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO users(id, workspace_id, name, email, created_at) VALUES(?,?,?,?,?)`,
		u.ID, u.WorkspaceID, u.Name, email, fmtTime(u.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("user %s: %w", u.ID, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert user %s: %w", u.ID, err)
	}
	return nil
}

// GetUser returns live user id of workspaceID.
func (s *SQLite) GetUser(ctx context.Context, workspaceID, id string) (*User, error) {
	return queryOne(ctx, s.db, "user", scanUser, id, `SELECT `+userCols+` FROM users WHERE workspace_id=? AND id=? AND deleted_at IS NULL`, workspaceID, id)
}

// ListUsers lists workspaceID's live users, oldest first.
func (s *SQLite) ListUsers(ctx context.Context, workspaceID string) ([]*User, error) {
	return queryAll(ctx, s.db, "users", scanUser, `SELECT `+userCols+` FROM users WHERE workspace_id=? AND deleted_at IS NULL ORDER BY created_at, id`, workspaceID)
}

// DeleteUser marks user id deleted and revokes its keys in one
// transaction.
func (s *SQLite) DeleteUser(ctx context.Context, workspaceID, id string, at time.Time) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE users SET deleted_at=? WHERE workspace_id=? AND id=? AND deleted_at IS NULL`, fmtTime(at), workspaceID, id)
		if err != nil {
			return fmt.Errorf("delete user %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("user %s: %w", id, errdefs.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at=COALESCE(revoked_at, ?) WHERE workspace_id=? AND user=?`,
			fmtTime(at), workspaceID, id); err != nil {
			return fmt.Errorf("revoke keys of user %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM shares WHERE workspace_id=? AND grantee=?`, workspaceID, id); err != nil {
			return fmt.Errorf("drop shares with user %s: %w", id, err)
		}
		return nil
	})
}

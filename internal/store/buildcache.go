package store

import (
	"context"
	"fmt"
	"time"
)

// BuildCacheEntry is one cached Dockerfile step: the layer a step with
// Key produced. The entry owns the layer (its storage capture LayerID):
// pruning an entry deletes the layer unless a snapshot stacks it.
type BuildCacheEntry struct {
	WorkspaceID string
	Key         string
	LayerID     string
	Layer       string
	SizeBytes   int64
	CreatedAt   time.Time
	UsedAt      time.Time
}

const buildCacheCols = `workspace_id, cache_key, layer_id, layer, size_bytes, created_at, used_at`

func scanBuildCache(row scanner) (*BuildCacheEntry, error) {
	var e BuildCacheEntry
	var created, used string
	if err := row.Scan(&e.WorkspaceID, &e.Key, &e.LayerID, &e.Layer, &e.SizeBytes, &created, &used); err != nil {
		return nil, err
	}
	e.CreatedAt, e.UsedAt = parseTime(created), parseTime(used)
	return &e, nil
}

// GetBuildCache implements Store.
func (s *SQLite) GetBuildCache(ctx context.Context, workspaceID, key string) (*BuildCacheEntry, error) {
	return queryOne(ctx, s.db, "build cache entry", scanBuildCache, key,
		`UPDATE build_cache SET used_at=? WHERE workspace_id=? AND cache_key=? RETURNING `+buildCacheCols,
		fmtFixedTime(time.Now()), workspaceID, key)
}

// PutBuildCache implements Store.
func (s *SQLite) PutBuildCache(ctx context.Context, e *BuildCacheEntry) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("put build cache entry: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `UPDATE build_cache SET cache_key='retired/'||layer_id WHERE workspace_id=? AND cache_key=?`,
		e.WorkspaceID, e.Key); err != nil {
		return fmt.Errorf("put build cache entry: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO build_cache (`+buildCacheCols+`) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		e.WorkspaceID, e.Key, e.LayerID, e.Layer, e.SizeBytes, fmtFixedTime(e.CreatedAt), fmtFixedTime(e.UsedAt)); err != nil {
		return fmt.Errorf("put build cache entry: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("put build cache entry: %w", err)
	}
	return nil
}

// ListBuildCache implements Store.
func (s *SQLite) ListBuildCache(ctx context.Context, workspaceID string) ([]*BuildCacheEntry, error) {
	return queryAll(ctx, s.db, "build cache entries", scanBuildCache,
		`SELECT `+buildCacheCols+` FROM build_cache WHERE workspace_id=? ORDER BY used_at, cache_key`, workspaceID)
}

// DeleteBuildCache implements Store.
func (s *SQLite) DeleteBuildCache(ctx context.Context, workspaceID, key string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM build_cache WHERE workspace_id=? AND cache_key=?`, workspaceID, key); err != nil {
		return fmt.Errorf("delete build cache entry: %w", err)
	}
	return nil
}

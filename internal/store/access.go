package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

const accessCols = `seq, at, workspace_id, user_id, key_prefix, action, method, route, resource_kind, resource, sandbox, status, remote, request_id`

// AppendAccess stores recs in one transaction (the audit writes in
// batches so that requests never wait on it).
func (s *SQLite) AppendAccess(ctx context.Context, recs []AccessRecord) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		stmt, err := tx.PrepareContext(ctx, `INSERT INTO access_audit(`+strings.TrimPrefix(accessCols, "seq, ")+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)`)
		if err != nil {
			return fmt.Errorf("prepare access insert: %w", err)
		}
		defer stmt.Close()
		for _, r := range recs {
			if _, err := stmt.ExecContext(ctx, fmtFixedTime(r.Time), r.WorkspaceID, r.UserID, r.KeyPrefix, r.Action, r.Method, r.Route,
				r.ResourceKind, r.Resource, r.Sandbox, r.Status, r.Remote, r.RequestID); err != nil {
				return fmt.Errorf("insert access record: %w", err)
			}
		}
		return nil
	})
}

func scanAccess(row scanner) (AccessRecord, error) {
	var r AccessRecord
	var at string
	err := row.Scan(&r.Seq, &at, &r.WorkspaceID, &r.UserID, &r.KeyPrefix, &r.Action, &r.Method, &r.Route,
		&r.ResourceKind, &r.Resource, &r.Sandbox, &r.Status, &r.Remote, &r.RequestID)
	r.Time = parseTime(at)
	return r, err
}

// ListAccess returns the records q selects, oldest first, at most q.Limit
// (all when ≤ 0).
func (s *SQLite) ListAccess(ctx context.Context, q AccessQuery) ([]AccessRecord, error) {
	where, args := []string{"seq > ?"}, []any{q.After}
	if q.WorkspaceID != "" {
		where, args = append(where, "workspace_id = ?"), append(args, q.WorkspaceID)
	}
	if q.User != "" {
		where, args = append(where, "user_id = ?"), append(args, q.User)
	}
	if !q.Since.IsZero() {
		where, args = append(where, "at >= ?"), append(args, fmtFixedTime(q.Since))
	}
	if len(q.Sandboxes) > 0 {
		where = append(where, "sandbox IN (?"+strings.Repeat(",?", len(q.Sandboxes)-1)+")")
		for _, sb := range q.Sandboxes {
			args = append(args, sb)
		}
	}
	limit := q.Limit
	if limit <= 0 {
		limit = -1
	}
	return queryAll(ctx, s.db, "access records", scanAccess,
		`SELECT `+accessCols+` FROM access_audit WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, append(args, limit)...)
}

package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// AuditQuery selects events of one sandbox's record, in seq order.
type AuditQuery struct {
	SandboxID string
	// SinceSeq keeps events with a greater seq.
	SinceSeq int64
	// Kinds, when set, keeps only events of those kinds.
	Kinds []string
	// Step, when > 0, keeps only that step's events.
	Step  int64
	Limit int
}

// AuditOutput is one stream of a command's captured output.
type AuditOutput struct {
	SandboxID  string
	Step       int64
	Stream     string // "stdout" or "stderr"
	Head, Tail []byte
	TotalBytes int64
	Truncated  bool
	Time       time.Time
}

// The audit methods are not part of Store: the record (internal/record)
// is its own seam over the same database, behind record.Store.

// AppendAuditEvents inserts evs in one transaction. An event whose
// (sandbox_id, seq) is already stored is ignored.
func (s *SQLite) AppendAuditEvents(ctx context.Context, evs []protocol.AuditEvent, outs []AuditOutput) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append audit events: %w", err)
	}
	defer tx.Rollback()
	if err := insertAll(ctx, tx, `INSERT OR IGNORE INTO audit_events(sandbox_id, seq, time, workspace_id, actor_user, actor_key_prefix, kind, type, step, data)
		VALUES(?,?,?,?,?,?,?,?,?,?)`, len(evs), func(i int) []any {
		e := evs[i]
		var data any
		if len(e.Data) > 0 {
			data = string(e.Data)
		}
		return []any{e.SandboxID, e.Seq, fmtFixedTime(e.Time), e.WorkspaceID, e.Actor.User, e.Actor.KeyPrefix, e.Kind, e.Type, e.Step, data}
	}); err != nil {
		return fmt.Errorf("append audit events: %w", err)
	}
	if err := insertAll(ctx, tx, `INSERT OR REPLACE INTO audit_outputs(sandbox_id, step, stream, head, tail, total_bytes, truncated, time)
		VALUES(?,?,?,?,?,?,?,?)`, len(outs), func(i int) []any {
		o := outs[i]
		return []any{o.SandboxID, o.Step, o.Stream, nonNil(o.Head), nonNil(o.Tail), o.TotalBytes, o.Truncated, fmtFixedTime(o.Time)}
	}); err != nil {
		return fmt.Errorf("append audit output: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append audit events: %w", err)
	}
	return nil
}

// insertAll runs the insert query once per row, on one prepared statement.
func insertAll(ctx context.Context, tx *sql.Tx, query string, n int, row func(int) []any) error {
	if n == 0 {
		return nil
	}
	st, err := tx.PrepareContext(ctx, query)
	if err != nil {
		return err
	}
	defer st.Close()
	for i := range n {
		if _, err := st.ExecContext(ctx, row(i)...); err != nil {
			return err
		}
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// AuditEvents returns the events q selects, oldest first.
func (s *SQLite) AuditEvents(ctx context.Context, q AuditQuery) ([]protocol.AuditEvent, error) {
	where := []string{"sandbox_id = ?", "seq > ?"}
	args := []any{q.SandboxID, q.SinceSeq}
	if len(q.Kinds) > 0 {
		where = append(where, "kind IN (?"+strings.Repeat(",?", len(q.Kinds)-1)+")")
		for _, k := range q.Kinds {
			args = append(args, k)
		}
	}
	if q.Step > 0 {
		where = append(where, "step = ?")
		args = append(args, q.Step)
	}
	query := `SELECT sandbox_id, seq, time, workspace_id, actor_user, actor_key_prefix, kind, type, step, data FROM audit_events WHERE ` +
		strings.Join(where, " AND ") + ` ORDER BY seq`
	if q.Limit > 0 {
		query += fmt.Sprintf(" LIMIT %d", q.Limit)
	}
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list audit events of %s: %w", q.SandboxID, err)
	}
	defer rows.Close()
	var out []protocol.AuditEvent
	for rows.Next() {
		var e protocol.AuditEvent
		var at string
		var data sql.NullString
		if err := rows.Scan(&e.SandboxID, &e.Seq, &at, &e.WorkspaceID, &e.Actor.User, &e.Actor.KeyPrefix, &e.Kind, &e.Type, &e.Step, &data); err != nil {
			return nil, fmt.Errorf("list audit events of %s: %w", q.SandboxID, err)
		}
		e.Time = parseTime(at)
		if data.Valid {
			e.Data = []byte(data.String)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list audit events of %s: %w", q.SandboxID, err)
	}
	return out, nil
}

// MaxAuditSeq is the greatest seq stored for sandboxID (0 for none), and
// the workspace of its record ("" for none).
func (s *SQLite) MaxAuditSeq(ctx context.Context, sandboxID string) (seq int64, workspaceID string, err error) {
	err = s.db.QueryRowContext(ctx, `SELECT seq, workspace_id FROM audit_events WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1`, sandboxID).
		Scan(&seq, &workspaceID)
	if err == sql.ErrNoRows {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read last audit seq of %s: %w", sandboxID, err)
	}
	return seq, workspaceID, nil
}

// AuditOutputs returns the captured output streams of sandboxID's step.
func (s *SQLite) AuditOutputs(ctx context.Context, sandboxID string, step int64) ([]AuditOutput, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT stream, head, tail, total_bytes, truncated, time FROM audit_outputs WHERE sandbox_id = ? AND step = ? ORDER BY stream`,
		sandboxID, step)
	if err != nil {
		return nil, fmt.Errorf("read output of %s step %d: %w", sandboxID, step, err)
	}
	defer rows.Close()
	var out []AuditOutput
	for rows.Next() {
		o := AuditOutput{SandboxID: sandboxID, Step: step}
		var at string
		if err := rows.Scan(&o.Stream, &o.Head, &o.Tail, &o.TotalBytes, &o.Truncated, &at); err != nil {
			return nil, fmt.Errorf("read output of %s step %d: %w", sandboxID, step, err)
		}
		o.Time = parseTime(at)
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read output of %s step %d: %w", sandboxID, step, err)
	}
	return out, nil
}

// PruneAudit deletes events and output recorded before cutoff and returns
// how many events went.
func (s *SQLite) PruneAudit(ctx context.Context, cutoff time.Time) (int64, error) {
	c := fmtFixedTime(cutoff)
	res, err := s.db.ExecContext(ctx, `DELETE FROM audit_events WHERE time < ?`, c)
	if err != nil {
		return 0, fmt.Errorf("prune audit events: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM audit_outputs WHERE time < ?`, c); err != nil {
		return 0, fmt.Errorf("prune audit output: %w", err)
	}
	n, _ := res.RowsAffected()
	return n, nil
}

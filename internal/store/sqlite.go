package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// SQLite is the embedded Store. It serialises writers through one
// connection-level busy timeout and WAL, which is ample for one daemon.
type SQLite struct {
	db *sql.DB
}

var _ Store = (*SQLite)(nil)

// migrations are applied in order; the index+1 is the schema version stored
// in PRAGMA user_version. Append only.
var migrations = []string{
	`CREATE TABLE workspaces (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL,
		created_at TEXT NOT NULL
	);
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		user TEXT NOT NULL,
		role TEXT NOT NULL,
		hash TEXT NOT NULL UNIQUE,
		created_at TEXT NOT NULL
	);
	CREATE TABLE snapshots (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		created_by TEXT NOT NULL,
		name TEXT NOT NULL,
		status TEXT NOT NULL,
		status_message TEXT NOT NULL DEFAULT '',
		docker_image TEXT NOT NULL DEFAULT '',
		image_digest TEXT NOT NULL DEFAULT '',
		registry_id TEXT NOT NULL DEFAULT '',
		fs_capacity_bytes INTEGER NOT NULL,
		run_config TEXT NOT NULL DEFAULT '{}',
		layers TEXT NOT NULL DEFAULT '[]',
		created_at TEXT NOT NULL,
		updated_at TEXT NOT NULL
	);
	CREATE INDEX snapshots_ws ON snapshots(workspace_id, created_at);
	CREATE TABLE sandboxes (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		created_by TEXT NOT NULL,
		name TEXT NOT NULL,
		status TEXT NOT NULL,
		status_message TEXT NOT NULL DEFAULT '',
		snapshot_id TEXT NOT NULL,
		runtime TEXT NOT NULL,
		vcpus INTEGER NOT NULL,
		mem_bytes INTEGER NOT NULL,
		fs_capacity_bytes INTEGER NOT NULL,
		idle_ttl_seconds INTEGER NOT NULL,
		delete_after_stop_seconds INTEGER NOT NULL,
		run_config TEXT,
		token TEXT NOT NULL,
		created_at TEXT NOT NULL,
		updated_at TEXT NOT NULL,
		stopped_at TEXT,
		UNIQUE(workspace_id, name)
	);
	CREATE INDEX sandboxes_snapshot ON sandboxes(snapshot_id);`,
	// 2: PATCH-able proxy config, persisted idle-TTL activity, registries.
	`ALTER TABLE sandboxes ADD COLUMN proxy_config TEXT;
	ALTER TABLE sandboxes ADD COLUMN last_active_at TEXT;
	CREATE TABLE registries (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		name TEXT NOT NULL,
		url TEXT NOT NULL,
		username TEXT NOT NULL,
		sealed_password BLOB NOT NULL,
		created_at TEXT NOT NULL,
		created_by TEXT NOT NULL,
		updated_at TEXT NOT NULL,
		updated_by TEXT NOT NULL,
		UNIQUE(workspace_id, name)
	);`,
	// 3: snapshots captured from a sandbox (POST /boxes/{name}/snapshot).
	`ALTER TABLE snapshots ADD COLUMN source_sandbox_id TEXT NOT NULL DEFAULT '';`,
	// 4: a captured snapshot keeps its source's egress policy, which
	// sandboxes created from it inherit.
	`ALTER TABLE snapshots ADD COLUMN proxy_config TEXT;`,
	// 5: run configs stored once, by content, not copied into every
	// snapshot row (an image's Env can be large).
	`CREATE TABLE run_configs (
		id TEXT PRIMARY KEY,
		body TEXT NOT NULL
	);
	ALTER TABLE snapshots ADD COLUMN run_config_id TEXT NOT NULL DEFAULT '';`,
	// 6: identity (users; named, prefixed, expiring, revocable keys; the
	// instance-admin flag) and the access audit. Keys made before users
	// existed named a user by a free string: that string becomes the id
	// of a user row in the key's workspace, so sandboxes' created_by
	// still names the same user. The bootstrap key (user "admin" of the
	// default workspace) becomes the instance admin.
	`CREATE TABLE users (
		id TEXT NOT NULL,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		name TEXT NOT NULL,
		email TEXT,
		created_at TEXT NOT NULL,
		deleted_at TEXT,
		PRIMARY KEY (workspace_id, id)
	);
	INSERT INTO users(id, workspace_id, name, created_at)
		SELECT user, workspace_id, user, MIN(created_at) FROM api_keys GROUP BY workspace_id, user;
	ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN prefix TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN expires_at TEXT;
	ALTER TABLE api_keys ADD COLUMN revoked_at TEXT;
	ALTER TABLE api_keys ADD COLUMN instance_admin INTEGER NOT NULL DEFAULT 0;
	UPDATE api_keys SET instance_admin = 1 WHERE workspace_id = 'default' AND user = 'admin' AND role = 'admin';
	CREATE INDEX api_keys_user ON api_keys(workspace_id, user);
	CREATE TABLE access_audit (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		at TEXT NOT NULL,
		workspace_id TEXT NOT NULL,
		user_id TEXT NOT NULL,
		key_prefix TEXT NOT NULL,
		action TEXT NOT NULL,
		method TEXT NOT NULL,
		route TEXT NOT NULL,
		resource_kind TEXT NOT NULL,
		resource TEXT NOT NULL,
		sandbox TEXT NOT NULL,
		status INTEGER NOT NULL,
		remote TEXT NOT NULL,
		request_id TEXT NOT NULL
	);
	CREATE INDEX access_audit_ws ON access_audit(workspace_id, seq);`,
	// 7: per-workspace quotas (NULL: unlimited).
	`CREATE TABLE IF NOT EXISTS quotas (
		workspace_id TEXT PRIMARY KEY REFERENCES workspaces(id),
		max_sandboxes INTEGER,
		max_vcpus INTEGER,
		max_mem_bytes INTEGER,
		max_storage_bytes INTEGER,
		max_snapshots INTEGER
	);
	CREATE INDEX IF NOT EXISTS sandboxes_ws_status ON sandboxes(workspace_id, status);`,
	// 8: the per-sandbox audit record (internal/record) and captured
	// command output. No foreign keys: records outlive their sandboxes.
	// IF NOT EXISTS: tests roll the schema back to re-run migrations.
	`CREATE TABLE IF NOT EXISTS audit_events (
		sandbox_id TEXT NOT NULL,
		seq INTEGER NOT NULL,
		time TEXT NOT NULL,
		workspace_id TEXT NOT NULL,
		actor_user TEXT NOT NULL,
		actor_key_prefix TEXT NOT NULL DEFAULT '',
		kind TEXT NOT NULL,
		type TEXT NOT NULL,
		step INTEGER NOT NULL DEFAULT 0,
		data TEXT,
		PRIMARY KEY (sandbox_id, seq)
	) WITHOUT ROWID;
	CREATE INDEX IF NOT EXISTS audit_events_time ON audit_events(time);
	CREATE TABLE IF NOT EXISTS audit_outputs (
		sandbox_id TEXT NOT NULL,
		step INTEGER NOT NULL,
		stream TEXT NOT NULL,
		head BLOB NOT NULL,
		tail BLOB NOT NULL,
		total_bytes INTEGER NOT NULL,
		truncated INTEGER NOT NULL,
		time TEXT NOT NULL,
		PRIMARY KEY (sandbox_id, step, stream)
	) WITHOUT ROWID;
	CREATE INDEX IF NOT EXISTS audit_outputs_time ON audit_outputs(time);`,
	// 9: preserve_memory_on_stop: a stop checkpoints the sandbox's memory
	// and the next start restores it.
	`ALTER TABLE sandboxes ADD COLUMN preserve_memory_on_stop INTEGER NOT NULL DEFAULT 0;`,
	// 10: sharing a sandbox or snapshot with a user or the whole workspace
	// ('*'). A record's shares go with it (the triggers). IF NOT EXISTS
	// keeps it re-runnable on a schema rolled back past it (tests do).
	`CREATE TABLE IF NOT EXISTS shares (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		resource_kind TEXT NOT NULL CHECK (resource_kind IN ('sandbox', 'snapshot')),
		resource_id TEXT NOT NULL,
		grantee TEXT NOT NULL,
		access TEXT NOT NULL CHECK (access IN ('read', 'use')),
		created_by TEXT NOT NULL,
		created_at TEXT NOT NULL,
		UNIQUE(resource_kind, resource_id, grantee)
	);
	CREATE INDEX IF NOT EXISTS shares_grantee ON shares(resource_kind, grantee, resource_id);
	CREATE TRIGGER IF NOT EXISTS sandboxes_drop_shares AFTER DELETE ON sandboxes BEGIN
		DELETE FROM shares WHERE resource_kind='sandbox' AND resource_id=OLD.id;
	END;
	CREATE TRIGGER IF NOT EXISTS snapshots_drop_shares AFTER DELETE ON snapshots BEGIN
		DELETE FROM shares WHERE resource_kind='snapshot' AND resource_id=OLD.id;
	END;`,
	// 11: the 0.12 create options: labels on sandboxes and snapshots
	// (JSON objects), CPU in millicores (0: vcpus whole cores),
	// non-persistent sandboxes, and snapshot tags (at most one holder of
	// a name:tag in a workspace; '' is untagged).
	`ALTER TABLE sandboxes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
	ALTER TABLE sandboxes ADD COLUMN cpu_millicores INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN persistent INTEGER NOT NULL DEFAULT 1;
	ALTER TABLE snapshots ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
	ALTER TABLE snapshots ADD COLUMN tag TEXT NOT NULL DEFAULT '';
	CREATE UNIQUE INDEX IF NOT EXISTS snapshots_tag ON snapshots(workspace_id, name, tag) WHERE tag <> '';`,
	// 12: the Dockerfile build step cache: one layer per (workspace, step
	// key), pruned least recently used first; snapshots' start command
	// and its readiness probe.
	`CREATE TABLE IF NOT EXISTS build_cache (
		workspace_id TEXT NOT NULL,
		cache_key TEXT NOT NULL,
		layer_id TEXT NOT NULL,
		layer TEXT NOT NULL,
		size_bytes INTEGER NOT NULL,
		created_at TEXT NOT NULL,
		used_at TEXT NOT NULL,
		PRIMARY KEY (workspace_id, cache_key)
	) WITHOUT ROWID;
	CREATE INDEX IF NOT EXISTS build_cache_used ON build_cache(workspace_id, used_at);
	ALTER TABLE snapshots ADD COLUMN start_cmd TEXT NOT NULL DEFAULT '';
	ALTER TABLE snapshots ADD COLUMN ready_cmd TEXT NOT NULL DEFAULT '';`,
	// 13: built-in snapshots: the package versions a blueprint-built
	// snapshot holds (a JSON object of name → version; '{}' for other
	// snapshots), and the workspace row they belong to (BuiltinWorkspace,
	// which workspace lookups and lists never show).
	`ALTER TABLE snapshots ADD COLUMN packages TEXT NOT NULL DEFAULT '{}';
	INSERT OR IGNORE INTO workspaces(id, name, created_at) VALUES('builtin', 'cubicle:builtin', '1970-01-01T00:00:00Z');`,
	// 14: persistent volumes, their snapshots (which outlive the volume:
	// no foreign key to it) and sandboxes' attachments of them, in order.
	// An attachment goes with its sandbox; a volume with attachments
	// cannot be deleted (the foreign key backs DeleteVolume's check).
	`CREATE TABLE IF NOT EXISTS volumes (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		created_by TEXT NOT NULL,
		name TEXT NOT NULL,
		size_bytes INTEGER NOT NULL,
		from_snapshot_id TEXT NOT NULL DEFAULT '',
		created_at TEXT NOT NULL,
		UNIQUE(workspace_id, name)
	);
	CREATE TABLE IF NOT EXISTS volume_snapshots (
		id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL REFERENCES workspaces(id),
		created_by TEXT NOT NULL,
		name TEXT NOT NULL,
		volume_id TEXT NOT NULL,
		volume_name TEXT NOT NULL,
		size_bytes INTEGER NOT NULL,
		created_at TEXT NOT NULL,
		UNIQUE(workspace_id, name)
	);
	CREATE TABLE IF NOT EXISTS volume_attachments (
		sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
		position INTEGER NOT NULL,
		volume_id TEXT NOT NULL REFERENCES volumes(id),
		mount_path TEXT NOT NULL,
		read_only INTEGER NOT NULL,
		PRIMARY KEY (sandbox_id, position)
	);
	CREATE INDEX IF NOT EXISTS volume_attachments_volume ON volume_attachments(volume_id);`,
	// 15: Docker inside a sandbox: the per-sandbox opt-in, and the
	// snapshot's, which sandboxes created from it inherit.
	`ALTER TABLE sandboxes ADD COLUMN docker INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE snapshots ADD COLUMN docker INTEGER NOT NULL DEFAULT 0;`,
	// 16: data mounts: a sandbox's mount_config (spec §4.5) as validated at
	// create, NULL for none; it is served again at every boot.
	`ALTER TABLE sandboxes ADD COLUMN mount_config TEXT;`,
	// 17: warm pools: how many pre-booted instances each snapshot keeps
	// (and for how long), and the instances booted for them, so a
	// restarted daemon tears down what its predecessor left.
	`CREATE TABLE IF NOT EXISTS snapshot_pools (
		snapshot_id TEXT PRIMARY KEY,
		workspace_id TEXT NOT NULL,
		size INTEGER NOT NULL,
		max_age_seconds INTEGER NOT NULL
	) WITHOUT ROWID;
	CREATE TABLE IF NOT EXISTS pool_instances (
		id TEXT PRIMARY KEY,
		snapshot_id TEXT NOT NULL,
		created_at TEXT NOT NULL
	) WITHOUT ROWID;`,
}

// OpenSQLite opens (creating if needed) the database at path and migrates it.
func OpenSQLite(ctx context.Context, path string) (*SQLite, error) {
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // one writer; SQLite serialises anyway and this avoids SQLITE_BUSY storms
	s := &SQLite{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *SQLite) migrate(ctx context.Context) error {
	var version int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	for i := version; i < len(migrations); i++ {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("begin migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("apply migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", i+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("record migration %d: %w", i+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("commit migration %d: %w", i+1, err)
		}
	}
	return nil
}

// Close closes the database.
func (s *SQLite) Close() error { return s.db.Close() }

// Ping is the database's health probe: it reads the schema and takes (then
// releases, writing nothing) the write lock, so a database that cannot be
// read or no longer takes writes (read-only file, a held lock) reports why.
func (s *SQLite) Ping(ctx context.Context) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer conn.Close()
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_master").Scan(&n); err != nil {
		return fmt.Errorf("database read: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("database write lock: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("database write lock: %w", err)
	}
	return nil
}

const timeFmt = time.RFC3339Nano

func fmtTime(t time.Time) string { return t.UTC().Format(timeFmt) }

// fixedTimeFmt is RFC 3339 with all nine fraction digits, so that stored
// values order correctly as strings (used where SQL compares times).
const fixedTimeFmt = "2006-01-02T15:04:05.000000000Z07:00"

func fmtFixedTime(t time.Time) string { return t.UTC().Format(fixedTimeFmt) }

func parseTime(v string) time.Time {
	t, _ := time.Parse(timeFmt, v)
	return t
}

func isUnique(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// isForeignKey reports whether err is SQLite refusing a row whose
// reference does not exist.
func isForeignKey(err error) bool {
	return err != nil && strings.Contains(err.Error(), "FOREIGN KEY constraint failed")
}

const snapshotCols = `id, workspace_id, created_by, name, status, status_message, docker_image, image_digest, registry_id, fs_capacity_bytes, run_config, layers, created_at, updated_at, source_sandbox_id, run_config_id, proxy_config, labels, tag, start_cmd, ready_cmd, packages, docker`

// snapshotGet selects one snapshot with its run config (rows from before
// migration 5 keep theirs inline in run_config).
const snapshotGet = `SELECT s.id, s.workspace_id, s.created_by, s.name, s.status, s.status_message, s.docker_image, s.image_digest,
	s.registry_id, s.fs_capacity_bytes, COALESCE(r.body, s.run_config), s.layers, s.created_at, s.updated_at, s.source_sandbox_id, s.run_config_id, s.proxy_config,
	s.labels, s.tag, s.start_cmd, s.ready_cmd, s.packages, s.docker FROM snapshots s LEFT JOIN run_configs r ON r.id = s.run_config_id`

// snapshotList selects snapshots without their run configs or packages,
// so a list costs the same whatever the images' Env.
const snapshotList = `SELECT id, workspace_id, created_by, name, status, status_message, docker_image, image_digest,
	registry_id, fs_capacity_bytes, '{}', layers, created_at, updated_at, source_sandbox_id, run_config_id, proxy_config, labels, tag, start_cmd, ready_cmd, '{}', docker FROM snapshots`

// putRunConfig stores rc once by content and returns its id.
func putRunConfig(ctx context.Context, tx *sql.Tx, rc protocol.RunConfig) (string, error) {
	body, err := json.Marshal(rc)
	if err != nil {
		return "", fmt.Errorf("encode run_config: %w", err)
	}
	sum := sha256.Sum256(body)
	id := hex.EncodeToString(sum[:])
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO run_configs(id, body) VALUES(?,?)`, id, string(body)); err != nil {
		return "", fmt.Errorf("store run_config: %w", err)
	}
	return id, nil
}

// dropUnusedRunConfigs deletes run configs no snapshot refers to.
func dropUnusedRunConfigs(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM run_configs WHERE id NOT IN (SELECT run_config_id FROM snapshots)`); err != nil {
		return fmt.Errorf("drop unused run_configs: %w", err)
	}
	return nil
}

// inTx runs fn in a transaction, committed when fn returns nil.
func (s *SQLite) inTx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// CreateSnapshot inserts a snapshot record. Its tag moves to it: the
// snapshot of the same name that held the tag becomes untagged.
func (s *SQLite) CreateSnapshot(ctx context.Context, sn *Snapshot) error {
	layers, _ := json.Marshal(sn.Layers)
	return s.inTx(ctx, func(tx *sql.Tx) error {
		rcID, err := putRunConfig(ctx, tx, sn.RunConfig)
		if err != nil {
			return err
		}
		if sn.Tag != "" {
			if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET tag='' WHERE workspace_id=? AND name=? AND tag=?`, sn.WorkspaceID, sn.Name, sn.Tag); err != nil {
				return fmt.Errorf("move tag %s:%s: %w", sn.Name, sn.Tag, err)
			}
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO snapshots(`+snapshotCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			sn.ID, sn.WorkspaceID, sn.CreatedBy, sn.Name, sn.Status, sn.StatusMessage, sn.DockerImage, sn.ImageDigest,
			sn.RegistryID, sn.FSCapacityBytes, "{}", string(layers), fmtTime(sn.CreatedAt), fmtTime(sn.UpdatedAt), sn.SourceSandboxID, rcID,
			nullJSON(sn.ProxyConfig), labelsJSON(sn.Labels), sn.Tag, sn.StartCmd, sn.ReadyCmd, labelsJSON(sn.Packages), sn.Docker)
		if err != nil {
			return fmt.Errorf("insert snapshot %s: %w", sn.ID, err)
		}
		return nil
	})
}

// UpdateSnapshot rewrites the mutable fields of a snapshot record.
func (s *SQLite) UpdateSnapshot(ctx context.Context, sn *Snapshot) error {
	layers, _ := json.Marshal(sn.Layers)
	return s.inTx(ctx, func(tx *sql.Tx) error {
		rcID, err := putRunConfig(ctx, tx, sn.RunConfig)
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE snapshots SET name=?, status=?, status_message=?, docker_image=?, image_digest=?, run_config='{}', run_config_id=?, layers=?, labels=?,
			start_cmd=?, ready_cmd=?, updated_at=?, packages=COALESCE(?, packages) WHERE id=?`,
			sn.Name, sn.Status, sn.StatusMessage, sn.DockerImage, sn.ImageDigest, rcID, string(layers), labelsJSON(sn.Labels),
			sn.StartCmd, sn.ReadyCmd, fmtTime(sn.UpdatedAt), packagesJSON(sn.Packages), sn.ID)
		if err != nil {
			return fmt.Errorf("update snapshot %s: %w", sn.ID, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("update snapshot %s: %w", sn.ID, errdefs.ErrNotFound)
		}
		return dropUnusedRunConfigs(ctx, tx)
	})
}

type scanner interface{ Scan(dest ...any) error }

// queryOne runs a query for one record of kind, named what in errors; no
// row is ErrNotFound.
func queryOne[T any](ctx context.Context, db *sql.DB, kind string, scan func(scanner) (T, error), what, query string, args ...any) (T, error) {
	v, err := scan(db.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("%s %s: %w", kind, what, errdefs.ErrNotFound)
	}
	if err != nil {
		return v, fmt.Errorf("get %s %s: %w", kind, what, err)
	}
	return v, nil
}

// queryAll runs a query for every matching record of kind.
func queryAll[T any](ctx context.Context, db *sql.DB, kind string, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", kind, err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", kind, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func scanSnapshot(row scanner) (*Snapshot, error) {
	var sn Snapshot
	var rc, layers, created, updated string
	var rcID string
	var proxy sql.NullString
	var labels, packages string
	if err := row.Scan(&sn.ID, &sn.WorkspaceID, &sn.CreatedBy, &sn.Name, &sn.Status, &sn.StatusMessage, &sn.DockerImage,
		&sn.ImageDigest, &sn.RegistryID, &sn.FSCapacityBytes, &rc, &layers, &created, &updated, &sn.SourceSandboxID, &rcID, &proxy,
		&labels, &sn.Tag, &sn.StartCmd, &sn.ReadyCmd, &packages, &sn.Docker); err != nil {
		return nil, err
	}
	if packages != "{}" {
		if err := json.Unmarshal([]byte(packages), &sn.Packages); err != nil {
			return nil, fmt.Errorf("decode packages of snapshot %s: %w", sn.ID, err)
		}
	}
	if err := json.Unmarshal([]byte(labels), &sn.Labels); err != nil {
		return nil, fmt.Errorf("decode labels of snapshot %s: %w", sn.ID, err)
	}
	if proxy.Valid {
		sn.ProxyConfig = []byte(proxy.String)
	}
	if err := json.Unmarshal([]byte(rc), &sn.RunConfig); err != nil {
		return nil, fmt.Errorf("decode run_config of snapshot %s: %w", sn.ID, err)
	}
	if err := json.Unmarshal([]byte(layers), &sn.Layers); err != nil {
		return nil, fmt.Errorf("decode layers of snapshot %s: %w", sn.ID, err)
	}
	sn.CreatedAt, sn.UpdatedAt = parseTime(created), parseTime(updated)
	return &sn, nil
}

// GetSnapshot returns the snapshot with id in workspaceID.
func (s *SQLite) GetSnapshot(ctx context.Context, workspaceID, id string) (*Snapshot, error) {
	return queryOne(ctx, s.db, "snapshot", scanSnapshot, id, snapshotGet+` WHERE s.workspace_id IN (?, ?) AND s.id=?`, workspaceID, BuiltinWorkspace, id)
}

// SnapshotByName returns snapshot name:tag in workspaceID; with tag ""
// or "latest" the one tagged latest, else the newest called name (a
// snapshot from before tags, or whose latest tag was deleted).
func (s *SQLite) SnapshotByName(ctx context.Context, workspaceID, name, tag string) (*Snapshot, error) {
	if tag != "" && tag != "latest" {
		return queryOne(ctx, s.db, "snapshot", scanSnapshot, name+":"+tag, snapshotGet+` WHERE s.workspace_id=? AND s.name=? AND s.tag=?`, workspaceID, name, tag)
	}
	return queryOne(ctx, s.db, "snapshot", scanSnapshot, name, snapshotGet+` WHERE s.workspace_id IN (?, ?) AND s.name=?
		ORDER BY s.workspace_id = ? ASC, s.tag = 'latest' DESC, s.status = ? DESC, s.created_at DESC LIMIT 1`,
		workspaceID, BuiltinWorkspace, name, BuiltinWorkspace, protocol.SnapshotReady)
}

// packagesJSON is packages as UpdateSnapshot writes them: NULL (keep the
// stored ones) when nil.
func packagesJSON(packages map[string]string) any {
	if packages == nil {
		return nil
	}
	return labelsJSON(packages)
}

// labelsJSON encodes labels as stored: a JSON object, never null.
func labelsJSON(labels map[string]string) string {
	if labels == nil {
		return "{}"
	}
	b, _ := json.Marshal(labels)
	return string(b)
}

// sortExpr is the SQL expression list kind sorts by for column col, and
// whether col may be sorted by. NULLs sort as "" so keyset comparisons
// hold.
func sortExpr(kind, col string) (string, bool) {
	if col == "" {
		col = "created_at"
	}
	if !slices.Contains(SortColumns[kind], col) {
		return "", false
	}
	if col == "stopped_at" {
		return "COALESCE(stopped_at, '')", true
	}
	return col, true
}

// listClause is the filter, order and page of a list of kind (the table
// name, for the visibility filter and the sort columns).
func listClause(kind string, o ListOptions) (string, []any, error) {
	var where strings.Builder
	args := []any{}
	add := func(clause string, a ...any) {
		where.WriteString(clause)
		args = append(args, a...)
	}
	if o.NameContains != "" {
		add(` AND instr(lower(name), lower(?)) > 0`, o.NameContains)
	}
	if o.Name != "" {
		add(` AND name=?`, o.Name)
	}
	if o.VisibleTo != "" {
		w, a := visibleClause(kind, o.VisibleTo)
		add(w, a...)
	}
	if o.CreatedBy != "" {
		add(` AND created_by=?`, o.CreatedBy)
	}
	if o.Status != "" {
		add(` AND status=?`, o.Status)
	}
	for _, l := range o.Labels {
		if l.HasValue {
			add(` AND EXISTS (SELECT 1 FROM json_each(labels) WHERE key=? AND value=?)`, l.Key, l.Value)
		} else {
			add(` AND EXISTS (SELECT 1 FROM json_each(labels) WHERE key=?)`, l.Key)
		}
	}
	expr, ok := sortExpr(kind, o.SortBy)
	if !ok {
		return "", nil, fmt.Errorf("sort %s by %q: %w", kind, o.SortBy, errdefs.ErrInvalid)
	}
	dir, cmp := "ASC", ">"
	if o.Desc {
		dir, cmp = "DESC", "<"
	}
	offset := o.Offset
	if c := o.After; c != nil {
		v := c.Value
		if v == nil {
			v = ""
		}
		add(fmt.Sprintf(` AND (%[1]s %[2]s ? OR (%[1]s = ? AND id %[2]s ?))`, expr, cmp), v, v, c.ID)
		offset = 0
	}
	limit := o.Limit
	if limit <= 0 {
		limit = -1
	}
	args = append(args, limit, offset)
	return where.String() + fmt.Sprintf(` ORDER BY %s %s, id %s LIMIT ? OFFSET ?`, expr, dir, dir), args, nil
}

// visibleClause keeps the records of kind user may see (ListOptions.VisibleTo).
func visibleClause(kind, user string) (string, []any) {
	shared := ` OR id IN (SELECT resource_id FROM shares WHERE resource_kind=? AND grantee IN (?, '*'))`
	switch kind {
	case "sandboxes":
		return ` AND (created_by=?` + shared + `)`, []any{user, ShareSandbox, user}
	case "snapshots":
		return ` AND (workspace_id=? OR created_by=?` + shared + `)`, []any{BuiltinWorkspace, user, ShareSnapshot, user}
	default:
		return ` AND created_by=?`, []any{user}
	}
}

// ListSnapshots lists a workspace's snapshots, oldest first, without run
// configs.
func (s *SQLite) ListSnapshots(ctx context.Context, workspaceID string, o ListOptions) ([]*Snapshot, error) {
	clause, args, err := listClause("snapshots", o)
	if err != nil {
		return nil, err
	}
	where, wargs := ` WHERE workspace_id=?`, []any{workspaceID}
	if o.WithBuiltin {
		where, wargs = ` WHERE workspace_id IN (?, ?)`, []any{workspaceID, BuiltinWorkspace}
	}
	return queryAll(ctx, s.db, "snapshots", scanSnapshot, snapshotList+where+clause, append(wargs, args...)...)
}

// SnapshotsWithStatus lists every workspace's snapshots in status, with
// their run configs.
func (s *SQLite) SnapshotsWithStatus(ctx context.Context, status string) ([]*Snapshot, error) {
	return queryAll(ctx, s.db, "snapshots", scanSnapshot, snapshotGet+` WHERE s.status=? ORDER BY s.created_at`, status)
}

// LayersInUse lists, once each, the layer directories every snapshot of
// every workspace stacks.
func (s *SQLite) LayersInUse(ctx context.Context) ([]string, error) {
	all, err := queryAll(ctx, s.db, "snapshot layers", func(row scanner) (string, error) {
		var v string
		err := row.Scan(&v)
		return v, err
	}, `SELECT DISTINCT layers FROM snapshots`)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, raw := range all {
		var layers []string
		if err := json.Unmarshal([]byte(raw), &layers); err != nil {
			return nil, fmt.Errorf("decode snapshot layers: %w", err)
		}
		for _, l := range layers {
			if !seen[l] {
				seen[l] = true
				out = append(out, l)
			}
		}
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot record (and its run config when no
// other snapshot shares it).
func (s *SQLite) DeleteSnapshot(ctx context.Context, workspaceID, id string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE workspace_id=? AND id=?`, workspaceID, id)
		if err != nil {
			return fmt.Errorf("delete snapshot %s: %w", id, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
		}
		return dropUnusedRunConfigs(ctx, tx)
	})
}

const sandboxCols = `id, workspace_id, created_by, name, status, status_message, snapshot_id, runtime, vcpus, mem_bytes, fs_capacity_bytes, idle_ttl_seconds, delete_after_stop_seconds, run_config, token, created_at, updated_at, stopped_at, proxy_config, last_active_at, preserve_memory_on_stop, labels, cpu_millicores, persistent, docker, mount_config`

func nullRunConfig(rc *protocol.RunConfig) any {
	if rc == nil {
		return nil
	}
	b, _ := json.Marshal(rc)
	return string(b)
}

func nullJSON(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func nullFixedTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return fmtFixedTime(*t)
}

func nullTime(t *time.Time) any {
	if t == nil {
		return nil
	}
	return fmtTime(*t)
}

// CreateSandbox inserts a sandbox record; a name clash wraps ErrConflict.
func (s *SQLite) CreateSandbox(ctx context.Context, sb *Sandbox) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			sb.ID, sb.WorkspaceID, sb.CreatedBy, sb.Name, sb.Status, sb.StatusMessage, sb.SnapshotID, sb.Runtime,
			sb.VCPUs, sb.MemBytes, sb.FSCapacityBytes, sb.IdleTTLSeconds, sb.DeleteAfterStopSeconds,
			nullRunConfig(sb.RunConfig), sb.Token, fmtTime(sb.CreatedAt), fmtTime(sb.UpdatedAt), nullTime(sb.StoppedAt),
			nullJSON(sb.ProxyConfig), nullFixedTime(sb.LastActiveAt), sb.PreserveMemoryOnStop, labelsJSON(sb.Labels), sb.CPUMillicores, sb.Persistent, sb.Docker, nullJSON(sb.MountConfig))
		if isUnique(err) {
			return fmt.Errorf("sandbox name %q: %w", sb.Name, errdefs.ErrConflict)
		}
		if err != nil {
			return fmt.Errorf("insert sandbox %s: %w", sb.ID, err)
		}
		return putAttachments(ctx, tx, sb.ID, sb.Volumes)
	})
}

// UpdateSandbox rewrites the mutable fields of a sandbox record, except
// LastActiveAt, which only SetSandboxActivity writes (so a record read
// before some activity cannot roll it back).
func (s *SQLite) UpdateSandbox(ctx context.Context, sb *Sandbox) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET name=?, status=?, status_message=?, idle_ttl_seconds=?,
		delete_after_stop_seconds=?, run_config=?, updated_at=?, stopped_at=?, proxy_config=?, vcpus=?, mem_bytes=?, fs_capacity_bytes=?,
		preserve_memory_on_stop=?, labels=?, cpu_millicores=? WHERE id=?`,
		sb.Name, sb.Status, sb.StatusMessage, sb.IdleTTLSeconds, sb.DeleteAfterStopSeconds, nullRunConfig(sb.RunConfig),
		fmtTime(sb.UpdatedAt), nullTime(sb.StoppedAt), nullJSON(sb.ProxyConfig), sb.VCPUs, sb.MemBytes, sb.FSCapacityBytes,
		sb.PreserveMemoryOnStop, labelsJSON(sb.Labels), sb.CPUMillicores, sb.ID)
	if isUnique(err) {
		return fmt.Errorf("sandbox name %q: %w", sb.Name, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("update sandbox %s: %w", sb.ID, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
	}
	return nil
}

func scanSandbox(row scanner) (*Sandbox, error) {
	var sb Sandbox
	var rc, stopped, proxy, active, mounts sql.NullString
	var created, updated, labels string
	if err := row.Scan(&sb.ID, &sb.WorkspaceID, &sb.CreatedBy, &sb.Name, &sb.Status, &sb.StatusMessage, &sb.SnapshotID,
		&sb.Runtime, &sb.VCPUs, &sb.MemBytes, &sb.FSCapacityBytes, &sb.IdleTTLSeconds, &sb.DeleteAfterStopSeconds,
		&rc, &sb.Token, &created, &updated, &stopped, &proxy, &active, &sb.PreserveMemoryOnStop,
		&labels, &sb.CPUMillicores, &sb.Persistent, &sb.Docker, &mounts); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(labels), &sb.Labels); err != nil {
		return nil, fmt.Errorf("decode labels of sandbox %s: %w", sb.ID, err)
	}
	if proxy.Valid {
		sb.ProxyConfig = []byte(proxy.String)
	}
	if mounts.Valid {
		sb.MountConfig = []byte(mounts.String)
	}
	if active.Valid {
		t := parseTime(active.String)
		sb.LastActiveAt = &t
	}
	if rc.Valid {
		sb.RunConfig = &protocol.RunConfig{}
		if err := json.Unmarshal([]byte(rc.String), sb.RunConfig); err != nil {
			return nil, fmt.Errorf("decode run_config of sandbox %s: %w", sb.ID, err)
		}
	}
	sb.CreatedAt, sb.UpdatedAt = parseTime(created), parseTime(updated)
	if stopped.Valid {
		t := parseTime(stopped.String)
		sb.StoppedAt = &t
	}
	return &sb, nil
}

// GetSandbox returns the sandbox called name in workspaceID.
func (s *SQLite) GetSandbox(ctx context.Context, workspaceID, name string) (*Sandbox, error) {
	sb, err := queryOne(ctx, s.db, "sandbox", scanSandbox, name, `SELECT `+sandboxCols+` FROM sandboxes WHERE workspace_id=? AND name=?`, workspaceID, name)
	return s.oneWithVolumes(ctx, sb, err)
}

// GetSandboxByID returns the sandbox with id, in any workspace.
func (s *SQLite) GetSandboxByID(ctx context.Context, id string) (*Sandbox, error) {
	sb, err := queryOne(ctx, s.db, "sandbox", scanSandbox, id, `SELECT `+sandboxCols+` FROM sandboxes WHERE id=?`, id)
	return s.oneWithVolumes(ctx, sb, err)
}

// ListSandboxes lists a workspace's sandboxes, oldest first.
func (s *SQLite) ListSandboxes(ctx context.Context, workspaceID string, o ListOptions) ([]*Sandbox, error) {
	clause, args, err := listClause("sandboxes", o)
	if err != nil {
		return nil, err
	}
	sbs, err := queryAll(ctx, s.db, "sandboxes", scanSandbox, `SELECT `+sandboxCols+` FROM sandboxes WHERE workspace_id=?`+clause, append([]any{workspaceID}, args...)...)
	return s.withVolumes(ctx, sbs, err)
}

// AllSandboxes lists every sandbox of every workspace.
func (s *SQLite) AllSandboxes(ctx context.Context) ([]*Sandbox, error) {
	sbs, err := queryAll(ctx, s.db, "sandboxes", scanSandbox, `SELECT `+sandboxCols+` FROM sandboxes ORDER BY created_at`)
	return s.withVolumes(ctx, sbs, err)
}

// LayerOwners implements Store.
func (s *SQLite) LayerOwners(ctx context.Context) (map[string]bool, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM snapshots UNION SELECT layer_id FROM build_cache UNION SELECT id FROM sandboxes`)
	if err != nil {
		return nil, fmt.Errorf("list layer owners: %w", err)
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("list layer owners: %w", err)
		}
		out[id] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list layer owners: %w", err)
	}
	return out, nil
}

// CountSandboxesUsingSnapshot counts sandboxes booted from snapshot id.
func (s *SQLite) CountSandboxesUsingSnapshot(ctx context.Context, id string) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE snapshot_id=?`, id).Scan(&n); err != nil {
		return 0, fmt.Errorf("count sandboxes of snapshot %s: %w", id, err)
	}
	return n, nil
}

// SetSandboxToken records sandbox id's agent token. It is the only writer of
// the token after CreateSandbox, so a record read before a boot cannot roll
// the token back.
func (s *SQLite) SetSandboxToken(ctx context.Context, id, token string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET token=? WHERE id=?`, token, id)
	if err != nil {
		return fmt.Errorf("record agent token of sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// SetSandboxActivity records when sandbox id was last active. It never
// moves the time backwards.
func (s *SQLite) SetSandboxActivity(ctx context.Context, id string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET last_active_at=? WHERE id=? AND (last_active_at IS NULL OR last_active_at < ?)`,
		fmtFixedTime(at), id, fmtFixedTime(at))
	if err != nil {
		return fmt.Errorf("record activity of sandbox %s: %w", id, err)
	}
	return nil
}

// DeleteSandbox removes a sandbox record.
func (s *SQLite) DeleteSandbox(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id=?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// PutPool records p, replacing snapshot p.SnapshotID's pool; size 0
// removes it.
func (s *SQLite) PutPool(ctx context.Context, p Pool) error {
	var err error
	if p.Size == 0 {
		_, err = s.db.ExecContext(ctx, `DELETE FROM snapshot_pools WHERE snapshot_id=?`, p.SnapshotID)
	} else {
		_, err = s.db.ExecContext(ctx, `INSERT INTO snapshot_pools(snapshot_id, workspace_id, size, max_age_seconds) VALUES(?,?,?,?)
			ON CONFLICT(snapshot_id) DO UPDATE SET size=excluded.size, max_age_seconds=excluded.max_age_seconds`,
			p.SnapshotID, p.WorkspaceID, p.Size, p.MaxAgeSeconds)
	}
	if err != nil {
		return fmt.Errorf("record pool of snapshot %s: %w", p.SnapshotID, err)
	}
	return nil
}

// ListPools returns every snapshot's pool, by snapshot id.
func (s *SQLite) ListPools(ctx context.Context) ([]Pool, error) {
	return queryAll(ctx, s.db, "pools", func(row scanner) (Pool, error) {
		var p Pool
		err := row.Scan(&p.SnapshotID, &p.WorkspaceID, &p.Size, &p.MaxAgeSeconds)
		return p, err
	}, `SELECT snapshot_id, workspace_id, size, max_age_seconds FROM snapshot_pools ORDER BY snapshot_id`)
}

// AddPoolInstance records pool instance i before anything of it exists.
func (s *SQLite) AddPoolInstance(ctx context.Context, i PoolInstance) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO pool_instances(id, snapshot_id, created_at) VALUES(?,?,?)`,
		i.ID, i.SnapshotID, fmtTime(i.CreatedAt)); err != nil {
		return fmt.Errorf("record pool instance %s: %w", i.ID, err)
	}
	return nil
}

// DeletePoolInstance forgets pool instance id (claimed or torn down); an
// unknown id is not an error.
func (s *SQLite) DeletePoolInstance(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM pool_instances WHERE id=?`, id); err != nil {
		return fmt.Errorf("forget pool instance %s: %w", id, err)
	}
	return nil
}

// ListPoolInstances returns the recorded pool instances, oldest first.
func (s *SQLite) ListPoolInstances(ctx context.Context) ([]PoolInstance, error) {
	return queryAll(ctx, s.db, "pool instances", func(row scanner) (PoolInstance, error) {
		var i PoolInstance
		var at string
		err := row.Scan(&i.ID, &i.SnapshotID, &at)
		i.CreatedAt = parseTime(at)
		return i, err
	}, `SELECT id, snapshot_id, created_at FROM pool_instances ORDER BY created_at`)
}

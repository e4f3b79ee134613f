package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Volume is a persistent volume of a workspace: a directory on the CoW
// store, limited to SizeBytes, that outlives the sandboxes it is attached
// to. Records are written only by the sandbox manager.
type Volume struct {
	ID          string
	WorkspaceID string
	CreatedBy   string
	Name        string
	SizeBytes   int64
	// FromSnapshotID is the volume snapshot it was cloned from ("": none).
	FromSnapshotID string
	CreatedAt      time.Time
}

// VolumeSnapshot is a read-only copy of a volume at one moment. It keeps
// the volume's id and name after the volume is gone.
type VolumeSnapshot struct {
	ID          string
	WorkspaceID string
	CreatedBy   string
	Name        string
	VolumeID    string
	VolumeName  string
	SizeBytes   int64
	CreatedAt   time.Time
}

// VolumeAttachment mounts volume VolumeID at MountPath in a sandbox.
// VolumeName is filled in on read (the volume's current name).
type VolumeAttachment struct {
	VolumeID   string
	VolumeName string
	MountPath  string
	ReadOnly   bool
}

// VolumeUse is an attachment seen from its volume: which sandbox mounts it
// where.
type VolumeUse struct {
	SandboxID, SandboxName string
	MountPath              string
	ReadOnly               bool
}

// VolumeStore persists volumes, their snapshots and attachments (part of
// Store). Lookups by name are within one workspace; a volume of another
// workspace is not found.
type VolumeStore interface {
	// CreateVolume inserts v; a name already used wraps ErrConflict.
	CreateVolume(ctx context.Context, v *Volume) error
	GetVolume(ctx context.Context, workspaceID, name string) (*Volume, error)
	// ListVolumes lists workspaceID's volumes ("" every workspace's),
	// by name.
	ListVolumes(ctx context.Context, workspaceID string) ([]*Volume, error)
	// DeleteVolume removes volume id of workspaceID; while any sandbox
	// (running or stopped) has it attached it refuses with ErrConflict.
	DeleteVolume(ctx context.Context, workspaceID, id string) error
	// VolumeUses lists the attachments of volume id, by sandbox name.
	VolumeUses(ctx context.Context, id string) ([]VolumeUse, error)
	// SetSandboxVolumes replaces sandbox id's attachments.
	SetSandboxVolumes(ctx context.Context, id string, vols []VolumeAttachment) error

	CreateVolumeSnapshot(ctx context.Context, vs *VolumeSnapshot) error
	GetVolumeSnapshot(ctx context.Context, workspaceID, name string) (*VolumeSnapshot, error)
	// ListVolumeSnapshots lists workspaceID's volume snapshots ("" every
	// workspace's), by name.
	ListVolumeSnapshots(ctx context.Context, workspaceID string) ([]*VolumeSnapshot, error)
	DeleteVolumeSnapshot(ctx context.Context, workspaceID, id string) error
}

const volumeCols = `id, workspace_id, created_by, name, size_bytes, from_snapshot_id, created_at`

func scanVolume(row scanner) (*Volume, error) {
	var v Volume
	var created string
	if err := row.Scan(&v.ID, &v.WorkspaceID, &v.CreatedBy, &v.Name, &v.SizeBytes, &v.FromSnapshotID, &created); err != nil {
		return nil, err
	}
	v.CreatedAt = parseTime(created)
	return &v, nil
}

// CreateVolume implements VolumeStore.
func (s *SQLite) CreateVolume(ctx context.Context, v *Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes(`+volumeCols+`) VALUES(?,?,?,?,?,?,?)`,
		v.ID, v.WorkspaceID, v.CreatedBy, v.Name, v.SizeBytes, v.FromSnapshotID, fmtTime(v.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("volume name %q: %w", v.Name, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert volume %s: %w", v.Name, err)
	}
	return nil
}

// GetVolume implements VolumeStore.
func (s *SQLite) GetVolume(ctx context.Context, workspaceID, name string) (*Volume, error) {
	return queryOne(ctx, s.db, "volume", scanVolume, name, `SELECT `+volumeCols+` FROM volumes WHERE workspace_id=? AND name=?`, workspaceID, name)
}

// ListVolumes implements VolumeStore.
func (s *SQLite) ListVolumes(ctx context.Context, workspaceID string) ([]*Volume, error) {
	return queryAll(ctx, s.db, "volumes", scanVolume, `SELECT `+volumeCols+` FROM volumes WHERE ?='' OR workspace_id=? ORDER BY name`, workspaceID, workspaceID)
}

// DeleteVolume implements VolumeStore. The check and the delete are one
// transaction, so no attachment made meanwhile is left dangling.
func (s *SQLite) DeleteVolume(ctx context.Context, workspaceID, id string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM volumes WHERE workspace_id=? AND id=?`, workspaceID, id).Scan(&n); err != nil {
			return fmt.Errorf("find volume %s: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("volume %s: %w", id, errdefs.ErrNotFound)
		}
		rows, err := tx.QueryContext(ctx, `SELECT DISTINCT s.name FROM volume_attachments a JOIN sandboxes s ON s.id=a.sandbox_id
			WHERE a.volume_id=? ORDER BY s.name`, id)
		if err != nil {
			return fmt.Errorf("list sandboxes using volume %s: %w", id, err)
		}
		var users []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				rows.Close()
				return fmt.Errorf("list sandboxes using volume %s: %w", id, err)
			}
			users = append(users, n)
		}
		rows.Close()
		if len(users) > 0 {
			return fmt.Errorf("volume is attached to sandboxes %s (detach it or delete them first): %w", strings.Join(users, ", "), errdefs.ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE workspace_id=? AND id=?`, workspaceID, id); err != nil {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
		return nil
	})
}

// VolumeUses implements VolumeStore.
func (s *SQLite) VolumeUses(ctx context.Context, id string) ([]VolumeUse, error) {
	return queryAll(ctx, s.db, "volume attachments", func(row scanner) (VolumeUse, error) {
		var u VolumeUse
		err := row.Scan(&u.SandboxID, &u.SandboxName, &u.MountPath, &u.ReadOnly)
		return u, err
	}, `SELECT s.id, s.name, a.mount_path, a.read_only FROM volume_attachments a JOIN sandboxes s ON s.id=a.sandbox_id
		WHERE a.volume_id=? ORDER BY s.name, a.position`, id)
}

// SetSandboxVolumes implements VolumeStore.
func (s *SQLite) SetSandboxVolumes(ctx context.Context, id string, vols []VolumeAttachment) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE id=?`, id).Scan(&n); err != nil {
			return fmt.Errorf("find sandbox %s: %w", id, err)
		}
		if n == 0 {
			return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM volume_attachments WHERE sandbox_id=?`, id); err != nil {
			return fmt.Errorf("detach volumes of sandbox %s: %w", id, err)
		}
		return putAttachments(ctx, tx, id, vols)
	})
}

// putAttachments records sandbox id's attachments. A volume deleted since
// it was validated fails the foreign key: ErrNotFound.
func putAttachments(ctx context.Context, tx *sql.Tx, id string, vols []VolumeAttachment) error {
	for i, v := range vols {
		_, err := tx.ExecContext(ctx, `INSERT INTO volume_attachments(sandbox_id, position, volume_id, mount_path, read_only) VALUES(?,?,?,?,?)`,
			id, i, v.VolumeID, v.MountPath, v.ReadOnly)
		if isForeignKey(err) {
			return fmt.Errorf("volume %s: %w", v.VolumeName, errdefs.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("attach volume %s to sandbox %s: %w", v.VolumeID, id, err)
		}
	}
	return nil
}

// oneWithVolumes is withVolumes for one sandbox lookup.
func (s *SQLite) oneWithVolumes(ctx context.Context, sb *Sandbox, err error) (*Sandbox, error) {
	if err != nil {
		return nil, err
	}
	if _, err := s.withVolumes(ctx, []*Sandbox{sb}, nil); err != nil {
		return nil, err
	}
	return sb, nil
}

// withVolumes fills in the attachments of sbs (the result of a query that
// failed with err, passed through).
func (s *SQLite) withVolumes(ctx context.Context, sbs []*Sandbox, err error) ([]*Sandbox, error) {
	if err != nil || len(sbs) == 0 {
		return sbs, err
	}
	byID := make(map[string]*Sandbox, len(sbs))
	args := make([]any, len(sbs))
	for i, sb := range sbs {
		sb.Volumes = []VolumeAttachment{}
		byID[sb.ID], args[i] = sb, sb.ID
	}
	where := `a.sandbox_id IN (?` + strings.Repeat(",?", len(sbs)-1) + `)`
	if len(sbs) > 500 { // every sandbox (AllSandboxes): no giant IN list
		where, args = `1`, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT a.sandbox_id, a.volume_id, v.name, a.mount_path, a.read_only
		FROM volume_attachments a JOIN volumes v ON v.id=a.volume_id WHERE `+where+` ORDER BY a.sandbox_id, a.position`, args...)
	if err != nil {
		return nil, fmt.Errorf("read volume attachments: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var a VolumeAttachment
		if err := rows.Scan(&id, &a.VolumeID, &a.VolumeName, &a.MountPath, &a.ReadOnly); err != nil {
			return nil, fmt.Errorf("read volume attachments: %w", err)
		}
		if sb := byID[id]; sb != nil {
			sb.Volumes = append(sb.Volumes, a)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read volume attachments: %w", err)
	}
	return sbs, nil
}

const volumeSnapshotCols = `id, workspace_id, created_by, name, volume_id, volume_name, size_bytes, created_at`

func scanVolumeSnapshot(row scanner) (*VolumeSnapshot, error) {
	var vs VolumeSnapshot
	var created string
	if err := row.Scan(&vs.ID, &vs.WorkspaceID, &vs.CreatedBy, &vs.Name, &vs.VolumeID, &vs.VolumeName, &vs.SizeBytes, &created); err != nil {
		return nil, err
	}
	vs.CreatedAt = parseTime(created)
	return &vs, nil
}

// CreateVolumeSnapshot implements VolumeStore; a name already used wraps
// ErrConflict.
func (s *SQLite) CreateVolumeSnapshot(ctx context.Context, vs *VolumeSnapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volume_snapshots(`+volumeSnapshotCols+`) VALUES(?,?,?,?,?,?,?,?)`,
		vs.ID, vs.WorkspaceID, vs.CreatedBy, vs.Name, vs.VolumeID, vs.VolumeName, vs.SizeBytes, fmtTime(vs.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("volume snapshot name %q: %w", vs.Name, errdefs.ErrConflict)
	}
	if err != nil {
		return fmt.Errorf("insert volume snapshot %s: %w", vs.Name, err)
	}
	return nil
}

// GetVolumeSnapshot implements VolumeStore.
func (s *SQLite) GetVolumeSnapshot(ctx context.Context, workspaceID, name string) (*VolumeSnapshot, error) {
	return queryOne(ctx, s.db, "volume snapshot", scanVolumeSnapshot, name,
		`SELECT `+volumeSnapshotCols+` FROM volume_snapshots WHERE workspace_id=? AND name=?`, workspaceID, name)
}

// ListVolumeSnapshots implements VolumeStore.
func (s *SQLite) ListVolumeSnapshots(ctx context.Context, workspaceID string) ([]*VolumeSnapshot, error) {
	return queryAll(ctx, s.db, "volume snapshots", scanVolumeSnapshot,
		`SELECT `+volumeSnapshotCols+` FROM volume_snapshots WHERE ?='' OR workspace_id=? ORDER BY name`, workspaceID, workspaceID)
}

// DeleteVolumeSnapshot implements VolumeStore.
func (s *SQLite) DeleteVolumeSnapshot(ctx context.Context, workspaceID, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM volume_snapshots WHERE workspace_id=? AND id=?`, workspaceID, id)
	if err != nil {
		return fmt.Errorf("delete volume snapshot %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("volume snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

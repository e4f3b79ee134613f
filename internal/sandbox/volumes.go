package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Persistent volumes are per-workspace directories on the CoW store that
// outlive sandboxes (VolumeStorage holds their files, the store their
// records). Every member of the workspace may use a volume — attach it,
// snapshot it, clone its snapshots — and its creator or an admin may
// delete it. A volume is attached to any number of sandboxes at once: they
// share one directory, read-write unless attached read-only, with no
// locking beyond POSIX's within this host. Attachments are bound into a
// sandbox at each boot (volumeMounts), so changing them applies at the
// next start; a running instance keeps the volumes it booted with, and
// those count as attached until it stops (box.volumes).

// MaxSandboxVolumes bounds the volumes one sandbox mounts.
const MaxSandboxVolumes = 16

// MinVolumeBytes is the smallest volume: room for the file system's own
// metadata besides a few files.
const MinVolumeBytes = 1 << 20

// VolumeView is a volume with what the API shows beside its record.
type VolumeView struct {
	*store.Volume
	// Uses are the sandboxes it is attached to.
	Uses []store.VolumeUse
	// UsedBytes is what only it holds on the store; nil if unmeasured.
	UsedBytes *int64
}

// VolumeSnapshotView is a volume snapshot with its measured bytes.
type VolumeSnapshotView struct {
	*store.VolumeSnapshot
	UsedBytes *int64
}

// volumeOwned is v as the policy sees it: every member of its workspace
// holds use on it.
func volumeOwned(workspace, createdBy string) authz.Owned {
	return authz.Owned{Workspace: workspace, CreatedBy: createdBy, Shared: authz.Use}
}

// CreateVolume makes an empty volume of req.SizeBytes or, with
// req.FromSnapshot, a copy-on-write clone of that volume snapshot (its
// size by default), within the workspace's storage quota. Nothing is left
// behind on failure.
func (m *Manager) CreateVolume(ctx context.Context, req protocol.CreateVolumeRequest) (*VolumeView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	var from *store.VolumeSnapshot
	size := req.SizeBytes
	if req.FromSnapshot != "" {
		if from, err = m.volumeSnapshotByName(ctx, p, req.FromSnapshot, authz.BootSnapshot); errdefs.IsNotFound(err) {
			return nil, errdefs.Field("from_snapshot", "no volume snapshot %q in this workspace", req.FromSnapshot)
		} else if err != nil {
			return nil, err
		}
		if size == 0 {
			size = from.SizeBytes
		}
	}
	if size < MinVolumeBytes || size > m.cfg.Limits.MaxFSBytes {
		return nil, errdefs.Field("size_bytes", "must be between %d and %d bytes", int64(MinVolumeBytes), m.cfg.Limits.MaxFSBytes)
	}
	v := &store.Volume{ID: uuid.NewString(), WorkspaceID: p.WorkspaceID, CreatedBy: p.User, Name: req.Name,
		SizeBytes: size, CreatedAt: time.Now().UTC()}
	if from != nil {
		v.FromSnapshotID = from.ID
	}
	start := time.Now()
	defer m.holdTransient(v.ID)() // its files exist before its record
	err = m.quota.admit(ctx, p.WorkspaceID, store.Usage{StorageBytes: size}, func() error {
		var enforced bool
		var err error
		if from != nil {
			enforced, err = m.cfg.Storage.CloneVolume(ctx, from.ID, v.ID, size)
		} else {
			enforced, err = m.cfg.Storage.CreateVolume(ctx, v.ID, size)
		}
		if err != nil {
			return fmt.Errorf("create volume %s: %w", v.Name, err)
		}
		if !enforced {
			m.log.Warn("volume size not enforced", "volume", v.ID, "backend", m.cfg.Storage.Backend())
		}
		if err := m.cfg.Store.CreateVolume(ctx, v); err != nil {
			m.removeVolumeFiles(ctx, v.ID)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.log.InfoContext(ctx, "volume created", "volume", v.ID, "name", v.Name, "size", size, "from_snapshot", v.FromSnapshotID, "took", time.Since(start))
	return &VolumeView{Volume: v, Uses: []store.VolumeUse{}}, nil
}

// GetVolume returns volume name of the caller's workspace.
func (m *Manager) GetVolume(ctx context.Context, name string) (*VolumeView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	v, err := m.volumeByName(ctx, p, name, authz.Get)
	if err != nil {
		return nil, err
	}
	views, err := m.volumeViews(ctx, []*store.Volume{v})
	if err != nil {
		return nil, err
	}
	return views[0], nil
}

// ListVolumes lists the caller's workspace's volumes, by name.
func (m *Manager) ListVolumes(ctx context.Context) ([]*VolumeView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	vols, err := m.cfg.Store.ListVolumes(ctx, p.WorkspaceID)
	if err != nil {
		return nil, err
	}
	return m.volumeViews(ctx, vols)
}

// volumeViews adds attachments and measured bytes to vols.
func (m *Manager) volumeViews(ctx context.Context, vols []*store.Volume) ([]*VolumeView, error) {
	ids := make([]string, len(vols))
	for i, v := range vols {
		ids[i] = v.ID
	}
	used := m.measureVolumes(ctx, ids, nil)
	out := make([]*VolumeView, len(vols))
	for i, v := range vols {
		uses, err := m.cfg.Store.VolumeUses(ctx, v.ID)
		if err != nil {
			return nil, err
		}
		if uses == nil {
			uses = []store.VolumeUse{}
		}
		out[i] = &VolumeView{Volume: v, Uses: uses, UsedBytes: used[v.ID]}
	}
	return out, nil
}

// measureVolumes is the exclusive bytes of volumes ids and volume
// snapshots snaps, by id; a store that cannot be measured is logged and
// yields none.
func (m *Manager) measureVolumes(ctx context.Context, ids, snaps []string) map[string]*int64 {
	out := map[string]*int64{}
	if len(ids)+len(snaps) == 0 {
		return out
	}
	got, err := m.cfg.Storage.VolumeUsage(ctx, ids, snaps)
	if err != nil {
		m.log.Warn("measure volumes", "err", err)
		return out
	}
	for id, n := range got {
		out[id] = &n
	}
	return out
}

// DeleteVolume deletes volume name and its data. While a sandbox, running
// or stopped, has it attached — or a running instance still mounts it
// after a detach — it refuses with ErrConflict. Its snapshots stay.
func (m *Manager) DeleteVolume(ctx context.Context, name string) error {
	p, err := principalOf(ctx)
	if err != nil {
		return err
	}
	v, err := m.volumeByName(ctx, p, name, authz.Delete)
	if err != nil {
		return err
	}
	if ids := m.mountedBy(v.ID); len(ids) > 0 {
		return fmt.Errorf("volume %s is still mounted by running sandboxes %s (detached, it goes at their next stop): %w",
			name, strings.Join(ids, ", "), errdefs.ErrConflict)
	}
	if err := m.cfg.Store.DeleteVolume(ctx, v.WorkspaceID, v.ID); err != nil {
		return fmt.Errorf("volume %s: %w", name, err)
	}
	m.removeVolumeFiles(ctx, v.ID)
	m.log.InfoContext(ctx, "volume deleted", "volume", v.ID, "name", v.Name)
	return nil
}

// removeVolumeFiles deletes volume id's files once it has no record (or
// never got one): a failure is logged, the record is what counts.
func (m *Manager) removeVolumeFiles(ctx context.Context, id string) {
	if err := m.cfg.Storage.RemoveVolume(context.WithoutCancel(ctx), id); err != nil {
		m.log.Error("remove volume files", "volume", id, "err", err)
	}
}

// SnapshotVolume takes read-only snapshot req.Name of volume name: a
// copy-on-write, crash-consistent copy of its files at this instant
// (sandboxes may be writing to it; what they have not flushed yet is not
// in it). It counts against the workspace's snapshot quota.
func (m *Manager) SnapshotVolume(ctx context.Context, name string, req protocol.SnapshotVolumeRequest) (*VolumeSnapshotView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	v, err := m.volumeByName(ctx, p, name, authz.Capture)
	if err != nil {
		return nil, err
	}
	vs := &store.VolumeSnapshot{ID: uuid.NewString(), WorkspaceID: v.WorkspaceID, CreatedBy: p.User, Name: req.Name,
		VolumeID: v.ID, VolumeName: v.Name, SizeBytes: v.SizeBytes, CreatedAt: time.Now().UTC()}
	start := time.Now()
	defer m.holdTransient(vs.ID)()
	err = m.quota.admit(ctx, v.WorkspaceID, snapshotClaim, func() error {
		if err := m.cfg.Storage.SnapshotVolume(ctx, v.ID, vs.ID); err != nil {
			return err
		}
		if err := m.cfg.Store.CreateVolumeSnapshot(ctx, vs); err != nil {
			m.removeVolumeSnapshotFiles(ctx, vs.ID)
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.log.InfoContext(ctx, "volume snapshot taken", "volume", v.ID, "snapshot", vs.ID, "name", vs.Name, "took", time.Since(start))
	return &VolumeSnapshotView{VolumeSnapshot: vs}, nil
}

// ListVolumeSnapshots lists the caller's workspace's volume snapshots.
func (m *Manager) ListVolumeSnapshots(ctx context.Context) ([]*VolumeSnapshotView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	list, err := m.cfg.Store.ListVolumeSnapshots(ctx, p.WorkspaceID)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(list))
	for i, vs := range list {
		ids[i] = vs.ID
	}
	used := m.measureVolumes(ctx, nil, ids)
	out := make([]*VolumeSnapshotView, len(list))
	for i, vs := range list {
		out[i] = &VolumeSnapshotView{VolumeSnapshot: vs, UsedBytes: used[vs.ID]}
	}
	return out, nil
}

// DeleteVolumeSnapshot deletes volume snapshot name; volumes cloned from
// it keep their files.
func (m *Manager) DeleteVolumeSnapshot(ctx context.Context, name string) error {
	p, err := principalOf(ctx)
	if err != nil {
		return err
	}
	vs, err := m.volumeSnapshotByName(ctx, p, name, authz.Delete)
	if err != nil {
		return err
	}
	if err := m.cfg.Store.DeleteVolumeSnapshot(ctx, vs.WorkspaceID, vs.ID); err != nil {
		return err
	}
	m.removeVolumeSnapshotFiles(ctx, vs.ID)
	return nil
}

func (m *Manager) removeVolumeSnapshotFiles(ctx context.Context, id string) {
	if err := m.cfg.Storage.RemoveVolumeSnapshot(context.WithoutCancel(ctx), id); err != nil {
		m.log.Error("remove volume snapshot files", "snapshot", id, "err", err)
	}
}

// volumeByName loads volume name of p's workspace if p may perform op.
func (m *Manager) volumeByName(ctx context.Context, p auth.Principal, name string, op authz.Op) (*store.Volume, error) {
	v, err := m.cfg.Store.GetVolume(ctx, p.WorkspaceID, name)
	if err != nil {
		return nil, err
	}
	if err := authz.Check(p, volumeOwned(v.WorkspaceID, v.CreatedBy), op, "volume "+name); err != nil {
		return nil, err
	}
	return v, nil
}

// volumeSnapshotByName loads volume snapshot name of p's workspace if p
// may perform op.
func (m *Manager) volumeSnapshotByName(ctx context.Context, p auth.Principal, name string, op authz.Op) (*store.VolumeSnapshot, error) {
	vs, err := m.cfg.Store.GetVolumeSnapshot(ctx, p.WorkspaceID, name)
	if err != nil {
		return nil, err
	}
	if err := authz.Check(p, volumeOwned(vs.WorkspaceID, vs.CreatedBy), op, "volume snapshot "+name); err != nil {
		return nil, err
	}
	return vs, nil
}

// resolveVolumes checks the attachments a request names under field
// ("volumes") and returns them as the record keeps them: each names a
// volume of the caller's workspace (another workspace's is not found) at
// a distinct, valid mount path, none inside another.
func (m *Manager) resolveVolumes(ctx context.Context, field string, atts []protocol.VolumeAttachment) ([]store.VolumeAttachment, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if len(atts) > MaxSandboxVolumes {
		return nil, errdefs.Field(field, "at most %d volumes per sandbox", MaxSandboxVolumes)
	}
	out := make([]store.VolumeAttachment, 0, len(atts))
	for i, a := range atts {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := runtime.ValidateTarget(a.MountPath); err != nil {
			return nil, errdefs.Field(f+".mount_path", "%v", err)
		}
		for j, prev := range out {
			if runtime.TargetsOverlap(a.MountPath, prev.MountPath) {
				return nil, errdefs.Field(f+".mount_path", "%s overlaps %s[%d].mount_path %s", a.MountPath, field, j, prev.MountPath)
			}
		}
		if a.Name == "" {
			return nil, errdefs.Field(f+".name", "is required")
		}
		v, err := m.volumeByName(ctx, p, a.Name, authz.Get)
		if errdefs.IsNotFound(err) {
			return nil, errdefs.Field(f+".name", "no volume %q in this workspace", a.Name)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, store.VolumeAttachment{VolumeID: v.ID, VolumeName: v.Name, MountPath: a.MountPath, ReadOnly: a.ReadOnly})
	}
	return out, nil
}

// setVolumes replaces sb's attachments with vols (checked by
// resolveVolumes). They apply at its next boot; a memory image from its
// last stop is dropped, as its processes held the old mounts. Callers
// hold sb's lock.
func (m *Manager) setVolumes(ctx context.Context, sb *store.Sandbox, vols []store.VolumeAttachment) error {
	if slices.Equal(vols, sb.Volumes) {
		return nil
	}
	if err := m.cfg.Store.SetSandboxVolumes(ctx, sb.ID, vols); err != nil {
		if errdefs.IsNotFound(err) {
			return errdefs.Field("volumes", "a volume was deleted meanwhile: %v", err)
		}
		return err
	}
	sb.Volumes = vols
	if statusOf(sb) == Stopped {
		m.discardMemory(sb.ID)
	}
	return nil
}

// volumeMounts are sb's volumes as the runtime binds them, in order: every
// boot path (create, start, restore, fork) mounts the same ones.
func (m *Manager) volumeMounts(sb *store.Sandbox) []runtime.Mount {
	out := make([]runtime.Mount, len(sb.Volumes))
	for i, v := range sb.Volumes {
		out[i] = runtime.Mount{Source: m.cfg.Storage.VolumePath(v.VolumeID), Target: v.MountPath, ReadOnly: v.ReadOnly}
	}
	return out
}

// VolumeAttachments is sb's attachments as a request names them (forks
// carry them to their branches; the API shows them).
func VolumeAttachments(sb *store.Sandbox) []protocol.VolumeAttachment {
	out := make([]protocol.VolumeAttachment, len(sb.Volumes))
	for i, v := range sb.Volumes {
		out[i] = protocol.VolumeAttachment{Name: v.VolumeName, MountPath: v.MountPath, ReadOnly: v.ReadOnly}
	}
	return out
}

// setMounted records the volumes sandbox id's running instance mounts
// (nil once it has stopped).
func (m *Manager) setMounted(id string, vols []store.VolumeAttachment) {
	ids := make([]string, len(vols))
	for i, v := range vols {
		ids[i] = v.VolumeID
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.boxLocked(id).volumes = ids
}

// mountedBy returns the sandboxes whose running instance mounts volume
// id, sorted.
func (m *Manager) mountedBy(id string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for sb, b := range m.boxes {
		if slices.Contains(b.volumes, id) {
			out = append(out, sb)
		}
	}
	slices.Sort(out)
	return out
}

// volumeBytes is what workspace ws's volumes and volume snapshots hold on
// the store (measured where the backend can).
func (m *Manager) volumeBytes(ctx context.Context, ws string) (int64, error) {
	vols, err := m.cfg.Store.ListVolumes(ctx, ws)
	if err != nil {
		return 0, err
	}
	snaps, err := m.cfg.Store.ListVolumeSnapshots(ctx, ws)
	if err != nil {
		return 0, err
	}
	var ids, sids []string
	for _, v := range vols {
		ids = append(ids, v.ID)
	}
	for _, s := range snaps {
		sids = append(sids, s.ID)
	}
	var total int64
	for _, n := range m.measureVolumes(ctx, ids, sids) {
		total += *n
	}
	return total, nil
}

// volumeLeftovers lists volume and volume snapshot files that no record
// of any workspace has; those being made now are held (holdTransient).
func (m *Manager) volumeLeftovers(ctx context.Context) ([]Leftover, error) {
	known := map[string]bool{}
	vols, err := m.cfg.Store.ListVolumes(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list volume leftovers: %w", err)
	}
	for _, v := range vols {
		known[v.ID] = true
	}
	snaps, err := m.cfg.Store.ListVolumeSnapshots(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list volume leftovers: %w", err)
	}
	for _, s := range snaps {
		known[s.ID] = true
	}
	m.mu.Lock()
	for id := range m.transient {
		known[id] = true
	}
	m.mu.Unlock()
	var out []Leftover
	for _, kind := range []string{LeftoverVolume, LeftoverVolumeSnapshot} {
		ids, err := m.cfg.Storage.ListVolumeFiles(ctx, kind == LeftoverVolumeSnapshot)
		if err != nil {
			return nil, fmt.Errorf("list volume leftovers: %w", err)
		}
		for _, id := range ids {
			if !known[id] {
				out = append(out, Leftover{Kind: kind, ID: id})
			}
		}
	}
	return out, nil
}

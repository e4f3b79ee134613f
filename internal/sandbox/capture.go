package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandboxfs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Captured snapshots.
//
// A captured snapshot is its parent snapshot's layers plus one more: a
// read-only copy-on-write snapshot of the sandbox's upper dir taken while
// the sandbox was frozen. Sandboxes booted from it get an empty upper over
// those layers, so a branch costs only what it writes. The captured layer
// is owned by its snapshot record: it is deleted with the record, and the
// record cannot be deleted while a sandbox boots from it or another
// snapshot stacks on its layer.

// CaptureSnapshot snapshots sandbox name's filesystem as it is now. A
// running sandbox is frozen only for the instant of the copy and keeps
// running; a stopped one is captured as it is. The snapshot is ready when
// this returns.
func (m *Manager) CaptureSnapshot(ctx context.Context, name string, req protocol.CaptureSnapshotRequest) (*SnapshotView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateCaptureRequest(req, m.cfg.Limits); err != nil {
		return nil, err
	}
	sb, unlock, err := m.lockVisible(ctx, name, authz.Capture)
	if err != nil {
		return nil, err
	}
	defer unlock()
	ctx, end := m.cfg.Observer.Begin(ctx, OpCapture, sb.ID)
	v, err := m.capture(ctx, p.WorkspaceID, p.User, sb, req)
	end(err)
	return v, err
}

func validateCaptureRequest(req protocol.CaptureSnapshotRequest, lim LimitPolicy) error {
	if err := store.ValidateName("name", req.Name); err != nil {
		return err
	}
	if req.DockerImage != "" && (req.IncludeMemory || req.Checkpoint) {
		return errdefs.Field("docker_image", "an image exported from the sandbox's Docker has no memory to go with it; omit include_memory")
	}
	if err := validateSize("fs_capacity_bytes", req.FSCapacityBytes, lim.MaxFSBytes); err != nil {
		return err
	}
	if _, err := snapshotTag(req.Tag); err != nil {
		return err
	}
	if err := validateLabels("labels", req.Labels); err != nil {
		return err
	}
	return validateRunConfig("run_config", req.RunConfig)
}

// capture takes the snapshot of sb (whose lock the caller holds) and
// records it. Only ready and stopped sandboxes have a filesystem to take.
func (m *Manager) capture(ctx context.Context, workspaceID, user string, sb *store.Sandbox, req protocol.CaptureSnapshotRequest) (*SnapshotView, error) {
	if err := requireStatus(sb, opCapture); err != nil {
		return nil, err
	}
	if req.DockerImage != "" {
		return m.captureImage(ctx, workspaceID, user, sb, req)
	}
	memory := req.IncludeMemory || req.Checkpoint
	if memory {
		d, err := m.driverOf(sb)
		if err != nil {
			return nil, err
		}
		if _, ok := d.(runtime.Checkpointer); !ok {
			return nil, errdefs.Field("include_memory", "memory snapshots are not supported by the %s runtime (only gvisor can save a sandbox's memory); omit include_memory to capture the filesystem only", d.Name())
		}
		if sb.Docker {
			return nil, dockerKeepsNoMemory("include_memory")
		}
		if statusOf(sb) != Ready {
			return nil, errdefs.Field("include_memory", "sandbox %s is %s: it has no memory to capture; start it, or omit include_memory", sb.Name, sb.Status)
		}
	}
	parent, err := m.cfg.Store.GetSnapshot(ctx, sb.WorkspaceID, sb.SnapshotID)
	if err != nil {
		return nil, fmt.Errorf("snapshot of sandbox %s: %w", sb.Name, err)
	}
	tag, _ := snapshotTag(req.Tag) // checked by validateCaptureRequest
	labels, err := layerLabels("labels", sb.Labels, req.Labels)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sn := &store.Snapshot{
		ID: uuid.NewString(), WorkspaceID: workspaceID, CreatedBy: user, Name: req.Name, Tag: tag, Labels: labels,
		Status: protocol.SnapshotReady, DockerImage: parent.DockerImage, ImageDigest: parent.ImageDigest,
		FSCapacityBytes: or(req.FSCapacityBytes, sb.FSCapacityBytes), SourceSandboxID: sb.ID, ProxyConfig: sb.ProxyConfig,
		RunConfig: parent.RunConfig.Layer(sb.RunConfig).Layer(req.RunConfig), CreatedAt: now, UpdatedAt: now,
		StartCmd: parent.StartCmd, ReadyCmd: parent.ReadyCmd, Docker: sb.Docker, StatusMessage: captureNote(sb),
	}
	release, err := m.quota.reserve(ctx, workspaceID, snapshotClaim)
	if err != nil {
		return nil, err
	}
	defer release()
	defer m.holdTransient(sn.ID)()
	var undo cleanup.Stack
	defer undo.Run(ctx)
	start := time.Now()
	capt := m.freezeAndCapture
	if memory {
		capt = m.checkpointAndCapture
	}
	layer, frozen, err := capt(ctx, sb, sn.ID)
	if err != nil {
		return nil, err
	}
	undo.Push(func(ctx context.Context) error { return m.cfg.Storage.RemoveCapture(ctx, sn.ID) })
	m.cfg.Faults.Hit(fault.CaptureLayered)
	sn.Layers = append(slices.Clip(parent.Layers), layer)
	if err := m.cfg.Store.CreateSnapshot(ctx, sn); err != nil {
		return nil, err
	}
	undo.Release()
	m.emit(ctx, sb, protocol.EventCaptured, map[string]any{"snapshot_id": sn.ID, "snapshot_name": sn.Name,
		"include_memory": memory, "frozen_ms": frozen.Milliseconds()})
	m.log.Info("snapshot captured", "snapshot", sn.ID, "name", sn.Name, "sandbox", sb.ID, "memory", memory, "took", time.Since(start), "frozen", frozen)
	return &SnapshotView{Snapshot: sn}, nil
}

// freezeAndCapture copies sb's upper dir to snapshot snap's layer. A ready
// sandbox is frozen for the copy, so the layer is one point in time, and
// thawed whatever happens. It returns the layer path and how long the
// sandbox was frozen.
//
// The copy is crash-consistent, like a snapshot of a disk: every write(2)
// that returned before the freeze is in it — the namespace runtime shares
// the host's page cache, whose dirty pages a btrfs snapshot includes, and
// gVisor's gofer writes through to the host file (no Sentry write-back for
// write(2); checked by the e2e tests, which read files written just before
// a capture). Dirty pages of MAP_SHARED file mappings not yet msync'd may be
// missed, exactly as after a power cut, so no in-sandbox sync is run: it
// would cost an exec round trip (50-250 ms under gVisor) per capture.
func (m *Manager) freezeAndCapture(ctx context.Context, sb *store.Sandbox, snap string) (string, time.Duration, error) {
	rid := runtimeID(sb.ID)
	if statusOf(sb) != Ready {
		layer, err := m.cfg.Storage.Capture(ctx, rid, snap)
		return layer, 0, err
	}
	d, err := m.driverOf(sb)
	if err != nil {
		return "", 0, err
	}
	pauser, ok := d.(runtime.Pauser)
	if !ok {
		return "", 0, fmt.Errorf("the %s runtime cannot freeze a running sandbox; stop %s first: %w", d.Name(), sb.Name, errdefs.ErrConflict)
	}
	// Write back what the sandbox wrote so far while it still runs, so the
	// frozen window only covers writeback of the last few milliseconds.
	if err := m.cfg.Storage.Flush(ctx, rid); err != nil {
		return "", 0, err
	}
	t0 := time.Now()
	if err := pauser.Pause(ctx, rid); err != nil {
		return "", 0, fmt.Errorf("freeze sandbox %s: %w", sb.Name, err)
	}
	m.cfg.Faults.Hit(fault.CaptureFrozen)
	layer, cerr := m.cfg.Storage.Capture(ctx, rid, snap)
	rerr := pauser.Resume(context.WithoutCancel(ctx), rid)
	frozen := time.Since(t0)
	if rerr != nil {
		m.log.Error("thaw sandbox after capture", "sandbox", sb.ID, "err", rerr)
	}
	if err := errors.Join(cerr, rerr); err != nil {
		if cerr == nil {
			m.cfg.Storage.RemoveCapture(context.WithoutCancel(ctx), snap)
		}
		return "", frozen, err
	}
	return layer, frozen, nil
}

// ownLayer is the layer a captured snapshot added on top of its parent's,
// or "" for a snapshot built from an image.
func (m *Manager) ownLayer(sn *store.Snapshot) string {
	if sn.SourceSandboxID == "" || len(sn.Layers) == 0 {
		return ""
	}
	if l := sn.Layers[len(sn.Layers)-1]; l == m.cfg.Storage.CaptureLayer(sn.ID) {
		return l
	}
	return ""
}

// checkSnapshotDependents returns ErrConflict when another snapshot stacks
// on sn's captured layer (it was captured from a sandbox booted from sn):
// deleting the layer would break it and every sandbox booted from it.
func (m *Manager) checkSnapshotDependents(ctx context.Context, sn *store.Snapshot) error {
	own := m.ownLayer(sn)
	if own == "" {
		return nil
	}
	all, err := m.cfg.Store.ListSnapshots(ctx, sn.WorkspaceID, store.ListOptions{})
	if err != nil {
		return err
	}
	var deps []string
	for _, o := range all {
		if o.ID != sn.ID && slices.Contains(o.Layers, own) {
			deps = append(deps, o.Name)
		}
	}
	if len(deps) > 0 {
		return fmt.Errorf("snapshot %s is the base of snapshot(s) %v; delete them first: %w", sn.ID, deps, errdefs.ErrConflict)
	}
	return nil
}

// removeSnapshotData deletes a deleted snapshot's captured layer.
func (m *Manager) removeSnapshotData(ctx context.Context, sn *store.Snapshot) error {
	if m.ownLayer(sn) == "" {
		return nil
	}
	return m.cfg.Storage.RemoveCapture(ctx, sn.ID)
}

// seedIdentity gives a sandbox booted from a captured snapshot its own
// /etc/machine-id, written into its (new) upper dir before the first boot,
// so branches of one parent never share it. Its hostname is already its
// own name. The kernel's entropy needs nothing: neither gVisor nor the
// namespace runtime restores RNG state from a snapshot (no memory is
// captured), so every branch seeds its RNG afresh.
func (m *Manager) seedIdentity(ctx context.Context, rid string, sn *store.Snapshot) error {
	if sn.SourceSandboxID == "" {
		return nil
	}
	upper, err := m.cfg.Storage.Prepare(ctx, rid)
	if err != nil {
		return err
	}
	tree, err := sandboxfs.OpenTree(upper)
	if err != nil {
		return fmt.Errorf("seed machine-id: %w", err)
	}
	defer tree.Close()
	if err := tree.WriteFile(ctx, "/etc/machine-id", []byte(randomHex(16)+"\n"), 0o444); err != nil {
		return fmt.Errorf("seed machine-id: %w", err)
	}
	return nil
}

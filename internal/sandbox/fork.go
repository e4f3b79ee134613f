package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// MaxForkCount bounds one fork request.
const MaxForkCount = 64

// ForkResult is a fork's captured snapshot and its branches.
type ForkResult struct {
	Snapshot  *store.Snapshot
	Sandboxes []*store.Sandbox
}

// Fork captures sandbox name and boots req.Count branches from the
// capture, in parallel, each with its own name (hostname) and machine-id,
// and with every policy of the parent: egress policy and rules, limits,
// TTLs and run_config.
// With req.IncludeMemory the capture includes memory and every branch is
// restored from it instead (see memsnap.go): it resumes the parent's
// processes, keeping their hostname and machine-id.
// Quotas are all-or-nothing: the branches are recorded together or, if
// count of them would exceed a quota, none is (nor is the capture kept).
// It returns when every branch is ready; branches that failed to boot are
// deleted and reported in the error, the others are kept and returned.
func (m *Manager) Fork(ctx context.Context, name string, req protocol.ForkRequest) (_ *ForkResult, err error) {
	if req.Count < 1 || req.Count > MaxForkCount {
		return nil, errdefs.Field("count", "must be between 1 and %d", MaxForkCount)
	}
	if len(req.Names) != 0 && len(req.Names) != req.Count {
		return nil, errdefs.Field("names", "must have count (%d) entries when given", req.Count)
	}
	for _, n := range req.Names {
		if err := store.ValidateName("names", n); err != nil {
			return nil, err
		}
	}
	parent, err := m.visible(ctx, name, authz.Fork)
	if err != nil {
		return nil, err
	}
	ctx, end := m.cfg.Observer.Begin(ctx, OpFork, parent.ID)
	defer func() { end(err) }()
	// Branches inherit the parent's egress policy through the capture;
	// check the caller may hold it before capturing anything.
	if err := m.validateEgress(ctx, parent.ProxyConfig); err != nil {
		return nil, err
	}
	// Branches get the parent's data mounts (the same buckets and
	// repositories, served afresh for each), under the same check.
	if _, err := m.validateMounts(ctx, parent.MountConfig, parent.ProxyConfig); err != nil {
		return nil, err
	}
	// A first check before the capture, so a fork that cannot fit does
	// no work; the branches are admitted for real once recorded below.
	branch := newSandboxClaim(parent)
	all := addUsage(scaleUsage(branch, int64(req.Count)), snapshotClaim)
	if err := m.quota.admit(ctx, parent.WorkspaceID, all, func() error { return nil }); err != nil {
		return nil, err
	}
	snapName := req.SnapshotName
	if snapName == "" {
		snapName = parent.Name + "-fork-" + randomHex(3)
		if len(snapName) > 63 {
			snapName = "fork-" + randomHex(6)
		}
	}
	v, err := m.CaptureSnapshot(ctx, name, protocol.CaptureSnapshotRequest{Name: snapName, IncludeMemory: req.IncludeMemory})
	if err != nil {
		return nil, err
	}
	timeout := int64(60)
	if req.Timeout != nil && *req.Timeout > 0 {
		timeout = *req.Timeout
	}
	wait := true
	reqs := make([]protocol.CreateSandboxRequest, req.Count)
	for i := range req.Count {
		bname := parent.Name + "-" + randomHex(3)
		if len(bname) > 63 {
			bname = "branch-" + randomHex(6)
		}
		if len(req.Names) > 0 {
			bname = req.Names[i]
		}
		// Every policy of the parent carries over: its runtime, limits
		// and TTLs here, its run_config layer, its volumes (the same
		// volumes, shared, not copies: a capture holds none of their
		// data), and its proxy_config (egress and rules) inherited from
		// the capture (v.ProxyConfig).
		reqs[i] = protocol.CreateSandboxRequest{
			WaitForReady: &wait, Timeout: &timeout, SnapshotID: v.ID, Name: bname,
			IdleTTLSeconds: &parent.IdleTTLSeconds, DeleteAfterStopSeconds: &parent.DeleteAfterStopSeconds,
			VCPUs: &parent.VCPUs, MemBytes: &parent.MemBytes, FSCapacityBytes: &parent.FSCapacityBytes,
			RunConfig: parent.RunConfig, Volumes: VolumeAttachments(parent), MountConfig: parent.MountConfig,
			Runtime: parent.Runtime,
		}
	}
	m.cfg.Faults.Hit(fault.ForkCaptured)
	sbs, sn, err := m.recordBranches(ctx, reqs)
	if err != nil {
		if derr := m.DeleteSnapshot(context.WithoutCancel(ctx), v.ID); derr != nil {
			m.log.Error("delete capture of a refused fork", "snapshot", v.ID, "err", derr)
		}
		return nil, fmt.Errorf("fork %s: %w", name, err)
	}
	m.cfg.Faults.Hit(fault.ForkRecorded)
	out := &ForkResult{Snapshot: v.Snapshot, Sandboxes: make([]*store.Sandbox, req.Count)}
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	for i := range req.Count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := m.bootNew(ctx, sbs[i], sn, reqs[i], nil)
			if err != nil && sb != nil {
				if derr := m.DeleteSandbox(context.WithoutCancel(ctx), sb.Name); derr != nil {
					m.log.Error("delete failed branch", "sandbox", sb.ID, "err", derr)
				}
				sb = nil
			}
			out.Sandboxes[i], errs[i] = sb, err
		}()
	}
	wg.Wait()
	kept := out.Sandboxes[:0]
	for _, sb := range out.Sandboxes {
		if sb != nil {
			kept = append(kept, sb)
		}
	}
	out.Sandboxes = kept
	m.emitForked(ctx, parent, v.ID, kept)
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("fork %s: %d of %d branches failed: %w", name, req.Count-len(kept), req.Count, err)
	}
	return out, nil
}

// recordBranches records a provisioning sandbox for each of reqs (which
// name the same snapshot, returned) as one claim on the workspace's
// quotas: all of them, or none when they would not fit or one fails.
func (m *Manager) recordBranches(ctx context.Context, reqs []protocol.CreateSandboxRequest) ([]*store.Sandbox, *store.Snapshot, error) {
	sbs := make([]*store.Sandbox, len(reqs))
	var sn *store.Snapshot
	var claim store.Usage
	for i, r := range reqs {
		sb, s, err := m.newSandbox(ctx, r)
		if err != nil {
			return nil, nil, err
		}
		sbs[i], sn, claim = sb, s, addUsage(claim, newSandboxClaim(sb))
	}
	err := m.quota.admit(ctx, sbs[0].WorkspaceID, claim, func() error {
		for i, sb := range sbs {
			if err := m.cfg.Store.CreateSandbox(ctx, sb); err != nil {
				for _, done := range sbs[:i] {
					if derr := m.cfg.Store.DeleteSandbox(context.WithoutCancel(ctx), done.ID); derr != nil {
						m.log.Error("undo branch record", "sandbox", done.ID, "err", derr)
					}
				}
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return sbs, sn, nil
}

// ResetSandbox discards everything sandbox name wrote and restarts it over
// snapshot snapshotID (by id or name; "" means its own snapshot): stop,
// replace the upper dir with an empty one (plus a fresh machine-id when
// the snapshot is a captured one), start. Its name, id, address, token and
// settings are kept.
func (m *Manager) ResetSandbox(ctx context.Context, name, snapshotID string) (*store.Sandbox, error) {
	sb, unlock, err := m.lockVisible(ctx, name, authz.Reset)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := requireStatus(sb, opReset); err != nil {
		return nil, err
	}
	if snapshotID == "" {
		snapshotID = sb.SnapshotID
	}
	sn, err := m.resolveSnapshot(ctx, sb.WorkspaceID, protocol.CreateSandboxRequest{SnapshotID: snapshotID})
	if err != nil {
		return nil, err
	}
	if statusOf(sb) == Ready {
		if err := m.halt(ctx, sb, "reset"); err != nil {
			return nil, err
		}
		m.emit(ctx, sb, protocol.EventStopped, stopReason{Reason: "reset"})
	}
	m.discardMemory(sb.ID) // its processes do not outlive the files they ran on
	// Stopped now, it starts again within the running quotas.
	release, err := m.quota.reserve(ctx, sb.WorkspaceID, runClaim(sb))
	if err != nil {
		return nil, err
	}
	defer release()
	rid := runtimeID(sb.ID)
	if err := m.cfg.Storage.Reset(ctx, rid); err != nil {
		return nil, err
	}
	if sn.ID != sb.SnapshotID {
		if err := m.cfg.Store.SetSandboxSnapshot(ctx, sb.ID, sn.ID); err != nil {
			return nil, err
		}
		sb.SnapshotID = sn.ID
	}
	if err := m.seedIdentity(ctx, rid, sn); err != nil {
		return nil, err
	}
	m.cfg.Faults.Hit(fault.ResetCleared)
	m.emit(ctx, sb, protocol.EventReset, map[string]string{"snapshot_id": sn.ID})
	if err := m.boot(ctx, sb, sn); err != nil {
		return nil, err
	}
	return m.cfg.Store.GetSandboxByID(ctx, sb.ID)
}

// Diff lists what changed going from a to b. Each names a sandbox (its
// current filesystem, live) or a snapshot (by id or name); sandboxes are
// looked up first.
func (m *Manager) Diff(ctx context.Context, a, b string) ([]storage.Change, error) {
	la, err := m.layersOf(ctx, a)
	if err != nil {
		return nil, err
	}
	lb, err := m.layersOf(ctx, b)
	if err != nil {
		return nil, err
	}
	return storage.Diff(ctx, la, lb)
}

func (m *Manager) layersOf(ctx context.Context, ref string) ([]string, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	sb, err := m.visible(ctx, ref, authz.Diff)
	if err == nil {
		sn, err := m.cfg.Store.GetSnapshot(ctx, sb.WorkspaceID, sb.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("snapshot of sandbox %s: %w", sb.Name, err)
		}
		return append(append([]string(nil), sn.Layers...), m.cfg.Storage.UpperDir(runtimeID(sb.ID))), nil
	}
	if !errdefs.IsNotFound(err) {
		return nil, err
	}
	sn, err := m.snapshotByRef(ctx, p.WorkspaceID, ref)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("no sandbox or snapshot %q: %w", ref, errdefs.ErrNotFound)
	}
	if err == nil {
		err = m.checkSnapshot(ctx, p, sn, authz.Diff, ref)
	}
	if err != nil {
		return nil, err
	}
	if sn.Status != protocol.SnapshotReady {
		return nil, fmt.Errorf("snapshot %s is %s: %w", sn.ID, sn.Status, errdefs.ErrNotReady)
	}
	return sn.Layers, nil
}

// Usage returns fs_used_bytes for sandboxes and snapshots, keyed by id:
// the bytes only they hold on the CoW store (btrfs exclusive bytes), so a
// fresh branch costs what it has written and a captured snapshot what no
// live sandbox still shares. Snapshots built from images use shared image
// layers and are not counted (absent from the result).
func (m *Manager) Usage(ctx context.Context, sandboxes []*store.Sandbox, snapshots []*store.Snapshot) (map[string]int64, error) {
	rids := map[string]string{}
	var ids, snaps []string
	for _, sb := range sandboxes {
		rid := runtimeID(sb.ID)
		rids[rid] = sb.ID
		ids = append(ids, rid)
	}
	for _, sn := range snapshots {
		if m.ownLayer(sn) != "" {
			snaps = append(snaps, sn.ID)
		}
	}
	if len(ids)+len(snaps) == 0 {
		return map[string]int64{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	got, err := m.cfg.Storage.Usage(ctx, ids, snaps)
	if err != nil {
		return nil, fmt.Errorf("measure usage: %w", err)
	}
	out := make(map[string]int64, len(got))
	for k, n := range got {
		if id, ok := rids[k]; ok {
			k = id
		}
		out[k] = n
	}
	return out, nil
}

// StorageBackend names the CoW store backend (see storage.CoW.Backend).
func (m *Manager) StorageBackend() string { return m.cfg.Storage.Backend() }

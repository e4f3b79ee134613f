package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/uuid"
)

// buildProgress tracks a building snapshot: an image pull's bytes, or a
// built-in's step and percentage. over closes when the build ends.
type buildProgress struct {
	total, done atomic.Int64
	mu          sync.Mutex
	step        string
	percent     int
	over        chan struct{}
}

func newBuildProgress() *buildProgress { return &buildProgress{over: make(chan struct{})} }

func (bp *buildProgress) setStep(step string, percent int) {
	bp.mu.Lock()
	bp.step, bp.percent = step, percent
	bp.mu.Unlock()
}

// SnapshotView is a snapshot record plus live build progress.
type SnapshotView struct {
	*store.Snapshot
	PullBytesTotal, PullBytesDone int64
	// BuildStep and BuildPercent are a built-in's progress ("" and 0
	// when none is reported).
	BuildStep    string
	BuildPercent int
}

// CreateSnapshot records a building snapshot and pulls its image in the
// background; the record turns ready or failed (with a message) when done.
func (m *Manager) CreateSnapshot(ctx context.Context, req protocol.CreateSnapshotRequest) (*SnapshotView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := validateSnapshotRequest(req, m.cfg.Limits); err != nil {
		return nil, err
	}
	tag, err := snapshotTag(req.Tag)
	if err != nil {
		return nil, err
	}
	if image.IsDigest(req.DockerImage) {
		// A bare digest names a local image or nothing: answer now, with
		// the same 404 whether another workspace holds it or no one does.
		img, err := m.cfg.Images.Resolve(ctx, p.WorkspaceID, req.DockerImage, nil, nil)
		if err != nil {
			return nil, err
		}
		img.Release()
	}
	if req.RegistryID != "" {
		// Check the registry now, so a bad registry_id is a 422 rather
		// than a snapshot that fails a moment later.
		if _, err := m.pullAuth(ctx, p.WorkspaceID, req.RegistryID, req.DockerImage); err != nil {
			return nil, err
		}
	}
	now := time.Now().UTC()
	sn := &store.Snapshot{
		ID: uuid.NewString(), WorkspaceID: p.WorkspaceID, CreatedBy: p.User, Name: req.Name,
		Status: protocol.SnapshotBuilding, DockerImage: req.DockerImage, RegistryID: req.RegistryID,
		FSCapacityBytes: req.FSCapacityBytes, CreatedAt: now, UpdatedAt: now, Tag: tag, Labels: req.Labels,
	}
	if req.RunConfig != nil {
		sn.RunConfig = *req.RunConfig
	}
	if err := m.quota.admit(ctx, sn.WorkspaceID, snapshotClaim, func() error {
		return m.cfg.Store.CreateSnapshot(ctx, sn)
	}); err != nil {
		return nil, err
	}
	m.startBuild(ctx, sn, req.RunConfig)
	return &SnapshotView{Snapshot: sn}, nil
}

// startBuild pulls sn's image in the background (see runBuild).
func (m *Manager) startBuild(ctx context.Context, sn *store.Snapshot, over *protocol.RunConfig) {
	m.runBuild(ctx, sn, over, func(ctx context.Context, bp *buildProgress) (*image.Image, error) {
		img, err := m.pullImage(ctx, sn, bp)
		if err != nil {
			return nil, fmt.Errorf("pull image %q: %w", sn.DockerImage, err)
		}
		return img, nil
	})
}

// runBuild makes sn's image with produce in the background, detached from
// ctx's cancellation but ended by Close (the snapshot then stays building
// for the next Recover), and marks sn ready (its layers and run config,
// over layered on the image's) or failed with produce's error.
func (m *Manager) runBuild(ctx context.Context, sn *store.Snapshot, over *protocol.RunConfig,
	produce func(context.Context, *buildProgress) (*image.Image, error)) {
	bp := newBuildProgress()
	m.mu.Lock()
	m.builds[sn.ID] = bp
	m.mu.Unlock()
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(m.life, cancel)
	m.goBG(func() {
		defer cancel()
		defer stop()
		defer func() {
			m.mu.Lock()
			delete(m.builds, sn.ID)
			m.mu.Unlock()
			close(bp.over)
		}()
		img, err := produce(ctx, bp)
		if err != nil && m.closing() {
			m.log.Info("snapshot build interrupted by shutdown; resumed at the next start", "snapshot", sn.ID)
			return
		}
		m.recordBuild(ctx, sn, over, img, err)
	})
}

// recordBuild stores a build's outcome.
func (m *Manager) recordBuild(ctx context.Context, sn *store.Snapshot, over *protocol.RunConfig, img *image.Image, err error) {
	sn.UpdatedAt = time.Now().UTC()
	if err != nil {
		sn.Status, sn.StatusMessage = protocol.SnapshotFailed, err.Error()
		m.log.Warn("snapshot build failed", "snapshot", sn.ID, "name", sn.Name, "err", err)
	} else {
		sn.Status, sn.StatusMessage, sn.ImageDigest, sn.Layers = protocol.SnapshotReady, "", img.Digest, img.Layers
		sn.RunConfig = img.Config.Layer(over)
	}
	octx, cancel := outcomeContext(ctx)
	defer cancel()
	if err := m.cfg.Store.UpdateSnapshot(octx, sn); err != nil {
		m.log.Error("record snapshot build result", "snapshot", sn.ID, "err", err)
	}
	img.Release() // the layers are recorded: GC now sees the snapshot use them
	if sn.Status == protocol.SnapshotReady && sn.WorkspaceID == store.BuiltinWorkspace {
		m.pruneBuiltins(octx, sn)
	}
}

// pullImage resolves sn's image (with its registry's credentials).
func (m *Manager) pullImage(ctx context.Context, sn *store.Snapshot, bp *buildProgress) (*image.Image, error) {
	var cred authn.Authenticator
	if sn.RegistryID != "" {
		var err error
		if cred, err = m.pullAuth(ctx, sn.WorkspaceID, sn.RegistryID, sn.DockerImage); err != nil {
			return nil, err
		}
	}
	return m.cfg.Images.Resolve(ctx, sn.WorkspaceID, sn.DockerImage, cred, func(pr image.Progress) {
		bp.total.Store(pr.Total)
		bp.done.Store(pr.Complete)
	})
}

// LayersInUse lists the layer directories that snapshots of every
// workspace stack (and so every sandbox, each booted from one): the image
// store's GC must keep them even when no image names them any more.
func (m *Manager) LayersInUse(ctx context.Context) ([]string, error) {
	return m.cfg.Store.LayersInUse(ctx)
}

// pullAuth returns the credentials of registry id for pulling ref.
func (m *Manager) pullAuth(ctx context.Context, workspaceID, id, ref string) (authn.Authenticator, error) {
	if m.cfg.Credentials == nil {
		return nil, errdefs.Field("registry_id", "this server has no registry credentials configured")
	}
	return m.cfg.Credentials.PullAuth(ctx, workspaceID, id, ref)
}

func (m *Manager) view(sn *store.Snapshot) *SnapshotView {
	v := &SnapshotView{Snapshot: sn}
	m.mu.Lock()
	if bp := m.builds[sn.ID]; bp != nil {
		v.PullBytesTotal, v.PullBytesDone = bp.total.Load(), bp.done.Load()
		bp.mu.Lock()
		v.BuildStep, v.BuildPercent = bp.step, bp.percent
		bp.mu.Unlock()
	}
	m.mu.Unlock()
	return v
}

// GetSnapshot returns a snapshot the caller may see.
func (m *Manager) GetSnapshot(ctx context.Context, id string) (*SnapshotView, error) {
	sn, err := m.visibleSnapshot(ctx, id, authz.Get)
	if err != nil {
		return nil, err
	}
	return m.view(sn), nil
}

// ListSnapshots lists the snapshots the caller may see.
func (m *Manager) ListSnapshots(ctx context.Context, o store.ListOptions) ([]*SnapshotView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	o.VisibleTo = authz.ListFilter(p)
	o.WithBuiltin = true
	list, err := m.cfg.Store.ListSnapshots(ctx, p.WorkspaceID, o)
	if err != nil {
		return nil, err
	}
	out := make([]*SnapshotView, len(list))
	for i, sn := range list {
		out[i] = m.view(sn)
	}
	return out, nil
}

// DeleteSnapshot removes a snapshot (and its captured layer, if any). It is
// refused (ErrConflict) while sandboxes booted from it exist, since their
// root filesystems use its layers, while another snapshot stacks on its
// captured layer, and while it is still building.
func (m *Manager) DeleteSnapshot(ctx context.Context, id string) error {
	sn, err := m.visibleSnapshot(ctx, id, authz.Delete)
	if err != nil {
		return err
	}
	if sn.Status == protocol.SnapshotBuilding {
		return fmt.Errorf("snapshot %s is still building: %w", id, errdefs.ErrConflict)
	}
	n, err := m.cfg.Store.CountSandboxesUsingSnapshot(ctx, id)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("snapshot %s is used by %d sandbox(es); delete them first: %w", id, n, errdefs.ErrConflict)
	}
	if err := m.checkSnapshotDependents(ctx, sn); err != nil {
		return err
	}
	if err := m.dropPool(ctx, sn.ID); err != nil {
		return err
	}
	if err := m.cfg.Store.DeleteSnapshot(ctx, sn.WorkspaceID, id); err != nil {
		return err
	}
	return m.removeSnapshotData(ctx, sn)
}

// snapshotByRef loads snapshot ref of workspaceID: an id, else a
// Docker-style name[:tag] (see store.Store.SnapshotByName).
func (m *Manager) snapshotByRef(ctx context.Context, workspaceID, ref string) (*store.Snapshot, error) {
	sn, err := m.cfg.Store.GetSnapshot(ctx, workspaceID, ref)
	if !errdefs.IsNotFound(err) {
		return sn, err
	}
	name, tag := SplitSnapshotRef(ref)
	sn, err = m.cfg.Store.SnapshotByName(ctx, workspaceID, name, tag)
	src, onDemand := m.cfg.OnDemandBuiltins[name]
	if !onDemand || tag != "" || (err == nil && sn.WorkspaceID != store.BuiltinWorkspace) {
		return sn, err
	}
	// An on-demand built-in (the workspace has none of its own): made
	// at this first use, or again for a new recipe.
	if err := m.EnsureBuiltin(ctx, name, src); err != nil {
		return nil, err
	}
	return m.cfg.Store.SnapshotByName(ctx, workspaceID, name, tag)
}

// resolveSnapshot finds the snapshot a create request names: by id, by
// name, or — when neither is given — the workspace's snapshot called
// "default", else the built-in one (BuilderSnapshot for the official
// clients' builder sandboxes); the caller must have use of it
// (authz.BootSnapshot). A built-in still building is waited for or
// answered as pending (awaitBuiltin).
func (m *Manager) resolveSnapshot(ctx context.Context, workspaceID string, req protocol.CreateSandboxRequest) (*store.Snapshot, error) {
	var sn *store.Snapshot
	var err error
	switch {
	case req.SnapshotID != "":
		// Accept a name[:tag] where an id is expected, as the OpenAPI docs allow.
		sn, err = m.snapshotByRef(ctx, workspaceID, req.SnapshotID)
	case req.SnapshotName != "":
		sn, err = m.snapshotByRef(ctx, workspaceID, req.SnapshotName)
	case builderName.MatchString(req.Name) && m.cfg.OnDemandBuiltins[BuilderSnapshot] != nil:
		sn, err = m.snapshotByRef(ctx, workspaceID, BuilderSnapshot)
	default:
		sn, err = m.cfg.Store.SnapshotByName(ctx, workspaceID, "default", "")
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("no snapshot given and no snapshot named \"default\" exists: %w", errdefs.ErrNotFound)
		}
	}
	if err != nil {
		return nil, err
	}
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := m.checkSnapshot(ctx, p, sn, authz.BootSnapshot, sn.ID); err != nil {
		return nil, err
	}
	if sn.WorkspaceID == store.BuiltinWorkspace && sn.Status != protocol.SnapshotReady {
		return m.awaitBuiltin(ctx, sn, builtinWait(req))
	}
	if sn.Status != protocol.SnapshotReady {
		return nil, fmt.Errorf("snapshot %s is %s, not ready: %w", sn.ID, sn.Status, errdefs.ErrNotReady)
	}
	return sn, nil
}

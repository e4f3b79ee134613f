package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/build"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Dockerfile builds.
//
// A built snapshot is its base's layers plus one layer per RUN, COPY,
// ADD and WORKDIR step. Those layers belong to the workspace's step cache
// (store.BuildCacheEntry), not to the snapshot: a rebuild with nothing
// changed stacks the same layers, and the cache prunes a layer only when
// no snapshot stacks it. The build's record is a snapshot in status
// building; its step log (BuildLog) is kept in memory while the daemon
// runs. A failed build leaves a failed record with the failing step's
// output and no layers.

const (
	// MaxBuildContextBytes bounds one build's context.
	MaxBuildContextBytes = 4 << 30
	// DefaultBuildCacheBytes is the step cache a workspace keeps.
	DefaultBuildCacheBytes = 10 << 30
	// keptBuildLogs is how many finished builds' logs stay readable.
	keptBuildLogs = 64
	// buildStepTimeout bounds one RUN step.
	buildStepTimeout = time.Hour
)

// BuildSnapshot unpacks the build context tar ctxTar, checks the
// Dockerfile (a FieldError naming its line when Cubicle cannot build it)
// and records a building snapshot whose build runs in the background.
func (m *Manager) BuildSnapshot(ctx context.Context, req protocol.BuildSnapshotRequest, ctxTar io.Reader) (*SnapshotView, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	tag, err := snapshotTag(req.Tag)
	if err != nil {
		return nil, err
	}
	fsBytes := req.FSCapacityBytes
	if fsBytes == 0 {
		fsBytes = m.cfg.Limits.DefaultFSBytes
	}
	if err := validateSize("fs_capacity_bytes", &fsBytes, m.cfg.Limits.MaxFSBytes); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(m.cfg.BuildDir, 0o700); err != nil {
		return nil, fmt.Errorf("build dir: %w", err)
	}
	dir, err := os.MkdirTemp(m.cfg.BuildDir, "context-")
	if err != nil {
		return nil, fmt.Errorf("build context dir: %w", err)
	}
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	df, err := build.ExtractContext(dir, ctxTar, MaxBuildContextBytes)
	if err != nil {
		return nil, err
	}
	if req.Dockerfile != "" {
		df = []byte(req.Dockerfile)
	}
	if len(df) == 0 {
		return nil, errdefs.Field("dockerfile", "is required: give dockerfile, or put a Dockerfile at the context's root")
	}
	plan, err := build.Parse(df, req.Target)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	sn := &store.Snapshot{
		ID: uuid.NewString(), WorkspaceID: p.WorkspaceID, CreatedBy: p.User, Name: req.Name, Tag: tag,
		Status: protocol.SnapshotBuilding, FSCapacityBytes: fsBytes, CreatedAt: now, UpdatedAt: now,
		StartCmd: req.StartCmd, ReadyCmd: req.ReadyCmd,
	}
	if err := m.quota.admit(ctx, sn.WorkspaceID, snapshotClaim, func() error {
		return m.cfg.Store.CreateSnapshot(ctx, sn)
	}); err != nil {
		return nil, err
	}
	log := build.NewLog()
	m.mu.Lock()
	m.buildLogs.add(sn.ID, log)
	m.mu.Unlock()
	keep = true
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(m.life, cancel)
	m.goBG(func() {
		defer cancel()
		defer stop()
		defer os.RemoveAll(dir)
		m.runDockerfile(bctx, sn, plan, build.Options{BuildArgs: req.BuildArgs, NoCache: req.NoCache, Context: dir, Log: log}, log)
	})
	return &SnapshotView{Snapshot: sn}, nil
}

// runDockerfile builds sn and records the outcome.
func (m *Manager) runDockerfile(ctx context.Context, sn *store.Snapshot, plan *build.Plan, o build.Options, log *build.Log) {
	defer log.Close()
	start := time.Now()
	m.buildGate.RLock()
	res, err := build.Build(ctx, plan, &buildWorker{m: m, ws: sn.WorkspaceID}, &buildCache{m: m, ws: sn.WorkspaceID}, o)
	sn.UpdatedAt = time.Now().UTC()
	if err != nil {
		if m.closing() {
			err = fmt.Errorf("interrupted by a daemon shutdown; build again: %w", err)
		}
		sn.Status, sn.StatusMessage = protocol.SnapshotFailed, truncateMessage("build failed: "+err.Error())
		fmt.Fprintf(log, "ERROR %v\n", err)
		m.log.Warn("snapshot build failed", "snapshot", sn.ID, "err", err)
	} else {
		sn.Status, sn.Layers, sn.RunConfig, sn.DockerImage = protocol.SnapshotReady, res.Layers, res.Config, res.BaseRef
		sn.Labels = m.builtLabels(res.Labels, log)
		if sn.StartCmd == "" {
			sn.StartCmd = res.StartCommand()
		}
		sn.StatusMessage = fmt.Sprintf("built %d layer steps (%d cached) in %.3fs", res.Steps, res.Cached, time.Since(start).Seconds())
		fmt.Fprintf(log, "DONE %s\n", sn.StatusMessage)
	}
	octx, cancel := outcomeContext(ctx)
	defer cancel()
	if uerr := m.cfg.Store.UpdateSnapshot(octx, sn); uerr != nil {
		m.log.Error("record snapshot build result", "snapshot", sn.ID, "err", uerr)
	}
	if res != nil {
		res.Release() // the layers are recorded: GC now sees the snapshot use them
	}
	m.buildGate.RUnlock()
	if err := m.pruneBuildCache(octx, sn.WorkspaceID); err != nil {
		m.log.Warn("prune build cache", "workspace", sn.WorkspaceID, "err", err)
	}
}

// builtLabels keeps the LABELs that are valid snapshot labels, noting
// the others in the log.
func (m *Manager) builtLabels(labels map[string]string, log io.Writer) map[string]string {
	out := map[string]string{}
	for k, v := range labels {
		if err := validateLabels("labels", map[string]string{k: v}); err != nil {
			fmt.Fprintf(log, "LABEL %s not kept: %v\n", k, err)
			continue
		}
		out[k] = v
	}
	if len(out) > maxLabels {
		fmt.Fprintf(log, "LABELs not kept: more than %d\n", maxLabels)
		return map[string]string{}
	}
	return out
}

// truncateMessage keeps a status message to a readable size (the step's
// output tail is already bounded; this bounds the rest).
func truncateMessage(s string) string {
	const limit = 8 << 10
	if len(s) > limit {
		return s[:limit] + "…"
	}
	return s
}

// BuildLog returns the step log of a snapshot build the caller may see:
// live while it builds, kept for the last builds after.
func (m *Manager) BuildLog(ctx context.Context, id string) (*build.Log, error) {
	sn, err := m.visibleSnapshot(ctx, id, authz.Get)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	log := m.buildLogs.get(sn.ID)
	m.mu.Unlock()
	if log == nil {
		return nil, fmt.Errorf("no build log of snapshot %s is kept (not built from a Dockerfile, or built before the daemon started): %w", sn.ID, errdefs.ErrNotFound)
	}
	return log, nil
}

// failInterruptedBuild marks a Dockerfile build that a restart cut short
// failed: its context is gone, so it cannot resume.
func (m *Manager) failInterruptedBuild(ctx context.Context, sn *store.Snapshot) {
	sn.Status, sn.StatusMessage, sn.UpdatedAt = protocol.SnapshotFailed, "build interrupted by a daemon restart; build again", time.Now().UTC()
	if err := m.cfg.Store.UpdateSnapshot(ctx, sn); err != nil {
		m.log.Error("record interrupted build", "snapshot", sn.ID, "err", err)
	}
}

// buildLogs keeps the logs of builds in flight and of the last
// keptBuildLogs builds. Guarded by Manager.mu.
type buildLogs struct {
	byID  map[string]*build.Log
	order []string
}

func (b *buildLogs) add(id string, l *build.Log) {
	if b.byID == nil {
		b.byID = map[string]*build.Log{}
	}
	b.byID[id] = l
	b.order = append(b.order, id)
	if len(b.order) > keptBuildLogs {
		delete(b.byID, b.order[0])
		b.order = b.order[1:]
	}
}

func (b *buildLogs) get(id string) *build.Log { return b.byID[id] }

// pruneBuildCache drops workspace ws's least recently used step results
// until the layers only the cache holds fit in Config.BuildCacheBytes. A
// layer a snapshot stacks is never deleted, and does not count: the
// snapshot needs it anyway (its entry stays, pruned once unused). It
// waits for builds in flight, which may be about to record a layer they
// took from the cache.
func (m *Manager) pruneBuildCache(ctx context.Context, ws string) error {
	m.buildGate.Lock()
	defer m.buildGate.Unlock()
	entries, err := m.cfg.Store.ListBuildCache(ctx, ws)
	if err != nil {
		return err
	}
	used, err := m.cfg.Store.LayersInUse(ctx)
	if err != nil {
		return err
	}
	inUse := map[string]bool{}
	for _, l := range used {
		inUse[l] = true
	}
	var total int64
	for _, e := range entries {
		if !inUse[e.Layer] {
			total += e.SizeBytes
		}
	}
	var errs []error
	for _, e := range entries {
		if total <= m.cfg.BuildCacheBytes {
			break
		}
		if inUse[e.Layer] {
			continue
		}
		if err := m.cfg.Store.DeleteBuildCache(ctx, ws, e.Key); err != nil {
			return err
		}
		errs = append(errs, m.cfg.Storage.RemoveCapture(ctx, e.LayerID))
		total -= e.SizeBytes
	}
	return errors.Join(errs...)
}

package sandbox

import (
	"context"
	"fmt"
	"regexp"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Built-in snapshots (the default computer) are records of
// store.BuiltinWorkspace that every workspace can list and boot but none
// can change (internal/authz). Their records are written only here: one
// per (name, source key); a new key builds a new record beside the old,
// the old stays (and with it the layers its sandboxes run on) until no
// sandbox uses it, and name resolution prefers a ready one.

// BuiltinSource makes the image of a built-in snapshot: internal/blueprint
// builds one from Debian's packages; an image reference or an archive is
// another.
type BuiltinSource interface {
	// Key names what Make produces: a built-in recorded under another key
	// is made again.
	Key() string
	// Describe is what the snapshot's docker_image shows.
	Describe() string
	// Make produces the image in workspace ws (the caller releases it),
	// reporting progress, and the versions of the packages it holds (nil
	// when unknown).
	Make(ctx context.Context, ws string, progress func(step string, percent int)) (*image.Image, map[string]string, error)
}

// BuiltinBoot is how sandboxes of a built-in snapshot boot: the
// snapshot's docker, start_cmd and ready_cmd.
type BuiltinBoot struct {
	// Docker: with Docker inside (runtime.Spec.Docker) unless a create
	// says otherwise.
	Docker             bool
	StartCmd, ReadyCmd string
}

// BuiltinBooter is implemented by the BuiltinSources whose snapshots boot
// other than plainly.
type BuiltinBooter interface {
	Boot() BuiltinBoot
}

// BuilderSnapshot is the on-demand built-in that the official clients'
// createSnapshotFromDockerfile gets for its builder sandbox. That client
// names no snapshot (it boots the default) but runs buildkitd, buildctl
// and docker as root in it; the one mark of its builder is the name it
// gives it, builderName, so a create naming no snapshot with such a name
// boots BuilderSnapshot instead of the default, when the daemon has one.
const BuilderSnapshot = "builder"

// builderName is the name the official clients give their builder
// sandbox: snapshot-builder- and 12 hex digits of a fresh UUID.
var builderName = regexp.MustCompile(`^snapshot-builder-[0-9a-f]{12}$`)

// BuiltinKeyLabel labels a built-in snapshot with its source's Key.
const BuiltinKeyLabel = "cubicle.dev/builtin-key"

// builtinCreator is the created_by of built-in snapshots.
const builtinCreator = "cubicle"

// builtinRetryAfter is the Retry-After of a create that needs a built-in
// snapshot still building.
const builtinRetryAfter = 10 * time.Second

// EnsureBuiltin makes sure the built-in snapshot name is, or is becoming,
// ready from src: when no record of src's key is ready it (re)builds one
// in the background and returns at once. A failed build is shown failed
// with its error and built again at the next call (the next daemon start).
func (m *Manager) EnsureBuiltin(ctx context.Context, name string, src BuiltinSource) error {
	m.builtinMu.Lock()
	defer m.builtinMu.Unlock()
	all, err := m.cfg.Store.ListSnapshots(ctx, store.BuiltinWorkspace, store.ListOptions{Name: name})
	if err != nil {
		return fmt.Errorf("list built-in snapshots: %w", err)
	}
	key := src.Key()
	var sn *store.Snapshot
	for _, s := range all {
		if s.Labels[BuiltinKeyLabel] != key {
			continue
		}
		if s.Status == protocol.SnapshotReady {
			m.pruneBuiltins(ctx, s)
			return nil
		}
		if m.building(s.ID) {
			return nil
		}
		sn = s // failed or interrupted: build again in place
	}
	now := time.Now().UTC()
	if sn == nil {
		sn = &store.Snapshot{ID: uuid.NewString(), WorkspaceID: store.BuiltinWorkspace, CreatedBy: builtinCreator, Name: name,
			Status: protocol.SnapshotBuilding, DockerImage: src.Describe(), FSCapacityBytes: m.cfg.Limits.DefaultFSBytes, CreatedAt: now, UpdatedAt: now,
			Labels: map[string]string{BuiltinKeyLabel: key}}
		if b, ok := src.(BuiltinBooter); ok {
			boot := b.Boot()
			sn.Docker, sn.StartCmd, sn.ReadyCmd = boot.Docker, boot.StartCmd, boot.ReadyCmd
		}
		if err := m.cfg.Store.CreateSnapshot(ctx, sn); err != nil {
			return fmt.Errorf("record built-in snapshot %s: %w", name, err)
		}
	} else {
		sn.Status, sn.StatusMessage, sn.UpdatedAt = protocol.SnapshotBuilding, "", now
		if err := m.cfg.Store.UpdateSnapshot(ctx, sn); err != nil {
			return fmt.Errorf("record built-in snapshot %s: %w", name, err)
		}
	}
	m.log.Info("building built-in snapshot", "name", name, "source", src.Describe(), "snapshot", sn.ID)
	m.runBuild(ctx, sn, nil, func(ctx context.Context, bp *buildProgress) (*image.Image, error) {
		img, pkgs, err := src.Make(ctx, store.BuiltinWorkspace, bp.setStep)
		if err != nil {
			return nil, fmt.Errorf("make built-in snapshot %s from %s (retried at the next daemon start): %w", name, src.Describe(), err)
		}
		sn.Packages = pkgs
		return img, nil
	})
	return nil
}

// building reports whether snapshot id's build runs now.
func (m *Manager) building(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.builds[id] != nil
}

// pruneBuiltins deletes the built-in snapshots named like keep, other
// than keep, that no sandbox uses (their layers go at the next image GC
// unless something else stacks them).
func (m *Manager) pruneBuiltins(ctx context.Context, keep *store.Snapshot) {
	all, err := m.cfg.Store.ListSnapshots(ctx, store.BuiltinWorkspace, store.ListOptions{Name: keep.Name})
	if err != nil {
		m.log.Warn("list built-in snapshots", "err", err)
		return
	}
	for _, sn := range all {
		if sn.ID == keep.ID || sn.Status == protocol.SnapshotBuilding {
			continue
		}
		n, err := m.cfg.Store.CountSandboxesUsingSnapshot(ctx, sn.ID)
		if err != nil || n > 0 {
			continue // in use (or unknown): kept for its sandboxes
		}
		if err := m.cfg.Store.DeleteSnapshot(ctx, store.BuiltinWorkspace, sn.ID); err != nil {
			m.log.Warn("delete superseded built-in snapshot", "snapshot", sn.ID, "err", err)
			continue
		}
		m.log.Info("deleted superseded built-in snapshot", "snapshot", sn.ID, "name", sn.Name)
	}
}

// awaitBuiltin is what a create does with a built-in snapshot that is not
// ready: wait up to wait for its build to end (0: not at all) and return
// it ready, or answer a PendingError (503 with Retry-After) while it
// still builds, or ErrNotReady saying why its build failed.
func (m *Manager) awaitBuiltin(ctx context.Context, sn *store.Snapshot, wait time.Duration) (*store.Snapshot, error) {
	if sn.Status == protocol.SnapshotBuilding && wait > 0 {
		m.mu.Lock()
		bp := m.builds[sn.ID]
		m.mu.Unlock()
		if bp != nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-bp.over:
			case <-t.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		fresh, err := m.cfg.Store.GetSnapshot(ctx, sn.WorkspaceID, sn.ID)
		if err != nil {
			return nil, err
		}
		sn = fresh
	}
	switch sn.Status {
	case protocol.SnapshotReady:
		return sn, nil
	case protocol.SnapshotBuilding:
		v := m.view(sn)
		step := ""
		if v.BuildStep != "" {
			step = fmt.Sprintf(" (%d%%: %s)", v.BuildPercent, v.BuildStep)
		}
		return nil, &errdefs.PendingError{RetryAfter: builtinRetryAfter,
			Msg: fmt.Sprintf("snapshot %q is still being built by this server%s; try again in a few seconds", sn.Name, step)}
	default:
		return nil, fmt.Errorf("snapshot %q (%s) could not be built: %s: %w", sn.Name, sn.ID, sn.StatusMessage, errdefs.ErrNotReady)
	}
}

// builtinWait is how long a create waits for a building built-in
// snapshot: its timeout when it asked to wait for readiness explicitly
// (wait_for_ready true and a timeout), else not at all.
func builtinWait(req protocol.CreateSandboxRequest) time.Duration {
	if req.WaitForReady == nil || !*req.WaitForReady || req.Timeout == nil {
		return 0
	}
	return time.Duration(*req.Timeout) * time.Second
}

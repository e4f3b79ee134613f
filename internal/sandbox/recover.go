package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Recover reconciles records with reality after a (re)start of the daemon:
// running sandboxes are re-adopted (their agent answers again), sandboxes
// whose processes are gone are marked stopped with their filesystem kept (a
// dataplane request or start boots them again), half-made ones are marked
// failed, interrupted deletions are finished, and interrupted snapshot
// pulls are resumed (interrupted Dockerfile builds, whose context is gone,
// are marked failed). A stopped sandbox whose instance outlived its record
// (the daemon died during its start) has that instance torn down, and a
// running one left paused or frozen (it died during a capture) is resumed.
// Warm-pool instances the previous daemon left are torn down
// (recoverPools). Then what ids without a record hold on the host is
// cleaned up (CleanLeftovers: their data is moved aside, not deleted).
func (m *Manager) Recover(ctx context.Context) error {
	sandboxes, err := m.cfg.Store.AllSandboxes(ctx)
	if err != nil {
		return err
	}
	held, err := m.heldInstances(ctx)
	if err != nil {
		return err
	}
	for _, sb := range sandboxes {
		m.recoverSandbox(ctx, sb, held)
	}
	if err := m.recoverPools(ctx); err != nil {
		m.log.Error("tear down the previous daemon's pool instances", "err", err)
	}
	if _, err := m.CleanLeftovers(ctx); err != nil {
		m.log.Error("clean up leftovers", "err", err)
	}
	snaps, err := m.cfg.Store.SnapshotsWithStatus(ctx, protocol.SnapshotBuilding)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.WorkspaceID == store.BuiltinWorkspace {
			// Only EnsureBuiltin knows how to make it: it builds it
			// again, unless this start does not ask for it.
			sn.Status, sn.StatusMessage, sn.UpdatedAt = protocol.SnapshotFailed, "build interrupted by a daemon restart", time.Now().UTC()
			if err := m.cfg.Store.UpdateSnapshot(ctx, sn); err != nil {
				return err
			}
			continue
		}
		if sn.DockerImage == "" || sn.SourceSandboxID != "" {
			// A Dockerfile build (its context is gone) or an image
			// export from a sandbox (captureImage: its stream is).
			m.failInterruptedBuild(ctx, sn)
			continue
		}
		m.startBuild(ctx, sn, nil)
	}
	return nil
}

// heldInstances returns the runtime ids holding an instance on any
// runtime or a network endpoint, listed once rather than asked per record.
func (m *Manager) heldInstances(ctx context.Context) (map[string]bool, error) {
	held := map[string]bool{}
	lists := []func(context.Context) ([]string, error){m.cfg.Network.List}
	for _, d := range m.rt {
		if l, ok := d.(runtime.Lister); ok {
			lists = append(lists, l.List)
		}
	}
	for _, list := range lists {
		ids, err := list(ctx)
		if err != nil {
			return nil, fmt.Errorf("list sandbox instances: %w", err)
		}
		for _, id := range ids {
			held[id] = true
		}
	}
	return held, nil
}

// recoverSandbox reconciles sb with what the host holds for it; held is
// heldInstances.
func (m *Manager) recoverSandbox(ctx context.Context, sb *store.Sandbox, held map[string]bool) {
	rid := runtimeID(sb.ID)
	log := m.log.With("sandbox", sb.ID, "name", sb.Name)
	switch statusOf(sb) {
	case Ready:
		err := m.readopt(ctx, sb)
		if err == nil {
			log.Info("re-adopted running sandbox")
			return
		}
		log.Warn("running sandbox not re-adopted; stopping it", "err", err)
		msg := "found not running after a daemon restart; the next request starts it again"
		if _, derr := m.driverOf(sb); derr != nil {
			msg = "stopped by a daemon restart: " + derr.Error()
		}
		remount := errors.Is(err, errMountsGone)
		if remount {
			msg = "restarted after a daemon restart: " + errMountsGone.Error()
		}
		if err := m.halt(ctx, sb, msg); err != nil {
			log.Error("mark sandbox stopped", "err", err)
			return
		}
		m.emit(ctx, sb, protocol.EventStopped, stopReason{Reason: protocol.StopCrash, Message: msg})
		if remount {
			// Its files are kept; it boots again at once with its
			// mounts served by this daemon.
			m.goBG(func() {
				if err := m.wake(context.WithoutCancel(ctx), sb.ID, true); err != nil {
					log.Error("restart sandbox with data mounts", "err", err)
				}
			})
		}
	case Provisioning:
		// The boot was interrupted: nothing of it can be trusted.
		if err := m.takeDown(ctx, m.servedDriver(sb), rid, false); err != nil {
			log.Warn("clean up interrupted boot", "err", err)
		}
		if err := m.transition(ctx, sb, Failed, "daemon restarted during boot"); err != nil {
			log.Error("mark sandbox failed", "err", err)
			return
		}
		m.emit(ctx, sb, protocol.EventBootFailed, map[string]string{"error": sb.StatusMessage})
	case Stopped:
		// A start that died before recording ready left its instance
		// up: the record is the truth, so the instance goes (its files
		// stay) and the next start boots it again.
		if !held[rid] {
			return
		}
		if err := m.takeDown(ctx, m.servedDriver(sb), rid, false); err != nil {
			log.Warn("tear down instance of a stopped sandbox", "err", err)
			return
		}
		log.Info("tore down the instance of an interrupted start")
	case Deleting:
		if err := m.destroy(ctx, sb); err != nil {
			log.Error("finish deleting sandbox", "err", err)
			return
		}
		m.emit(ctx, sb, protocol.EventDeleted, map[string]string{"reason": "recovery"})
	}
}

// readopt takes back a ready sandbox whose instance survived the daemon:
// its process runs on its runtime, its agent answers with the recorded
// token, and its egress policy is enforced again.
func (m *Manager) readopt(ctx context.Context, sb *store.Sandbox) error {
	rid := runtimeID(sb.ID)
	d, err := m.driverOf(sb)
	if err != nil {
		return err
	}
	running, err := d.Running(ctx, rid)
	if err != nil {
		return err
	}
	if !running {
		return errors.New("not running")
	}
	// A daemon that died during a capture left it paused (a checkpoint)
	// or frozen; resuming a running sandbox is a no-op.
	if p, ok := d.(runtime.Pauser); ok {
		if err := p.Resume(ctx, rid); err != nil {
			return err
		}
	}
	if hasJSON(sb.MountConfig) {
		return errMountsGone
	}
	ep, err := m.cfg.Network.Lookup(ctx, rid)
	if err != nil {
		return err
	}
	c := m.agentClient(d, rid, ep.SandboxIP, sb.Token)
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = c.Health(hctx)
	cancel()
	if err == nil {
		err = m.egressRestore(ctx, sb, ep)
	}
	if err != nil {
		c.Close()
		return err
	}
	m.setAgent(sb.ID, c)
	m.setMounted(sb.ID, sb.Volumes) // what it booted with, as far as the record knows
	m.watch(ctx, d, sb.ID, c)
	m.restoreActivity(sb) // neither reset nor zero the idle clock
	return nil
}

package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Recover reconciles records with reality after a (re)start of the daemon:
// running sandboxes are re-adopted (their agent answers again), sandboxes
// whose processes are gone are marked stopped with their filesystem kept (a
// dataplane request or start boots them again), half-made ones are marked
// failed, interrupted deletions are finished, and interrupted snapshot
// pulls are resumed (interrupted Dockerfile builds, whose context is gone,
// are marked failed). Then what ids without a record hold on the host is
// cleaned up (CleanLeftovers: their data is moved aside, not deleted).
func (m *Manager) Recover(ctx context.Context) error {
	sandboxes, err := m.cfg.Store.AllSandboxes(ctx)
	if err != nil {
		return err
	}
	for _, sb := range sandboxes {
		m.recoverSandbox(ctx, sb)
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
		if sn.DockerImage == "" {
			m.failInterruptedBuild(ctx, sn) // a Dockerfile build: its context is gone
			continue
		}
		m.startBuild(ctx, sn, nil)
	}
	return nil
}

func (m *Manager) recoverSandbox(ctx context.Context, sb *store.Sandbox) {
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
		if err := m.halt(ctx, sb, msg); err != nil {
			log.Error("mark sandbox stopped", "err", err)
			return
		}
		m.emit(ctx, sb, protocol.EventStopped, stopReason{Reason: protocol.StopCrash, Message: msg})
	case Provisioning:
		// The boot was interrupted: nothing of it can be trusted.
		if err := errors.Join(
			m.cfg.Driver.Stop(ctx, rid),
			m.cfg.Network.Teardown(ctx, rid),
			m.cfg.Storage.Unmount(ctx, rid),
		); err != nil {
			log.Warn("clean up interrupted boot", "err", err)
		}
		if err := m.transition(ctx, sb, Failed, "daemon restarted during boot"); err != nil {
			log.Error("mark sandbox failed", "err", err)
			return
		}
		m.emit(ctx, sb, protocol.EventBootFailed, map[string]string{"error": sb.StatusMessage})
	case Deleting:
		if err := m.destroy(ctx, sb); err != nil {
			log.Error("finish deleting sandbox", "err", err)
			return
		}
		m.emit(ctx, sb, protocol.EventDeleted, map[string]string{"reason": "recovery"})
	}
}

// readopt takes back a ready sandbox whose instance survived the daemon:
// its process runs, its agent answers with the recorded token, and its
// egress policy is enforced again.
func (m *Manager) readopt(ctx context.Context, sb *store.Sandbox) error {
	rid := runtimeID(sb.ID)
	running, err := m.cfg.Driver.Running(ctx, rid)
	if err != nil {
		return err
	}
	if !running {
		return errors.New("not running")
	}
	ep, err := m.cfg.Network.Lookup(ctx, rid)
	if err != nil {
		return err
	}
	c := agent.NewClient(m.agentAddr(ep.SandboxIP), sb.Token)
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
	m.watch(ctx, sb.ID, c)
	m.restoreActivity(sb) // neither reset nor zero the idle clock
	return nil
}

package sandbox

import (
	"context"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Recover reconciles records with reality after a (re)start of the daemon:
// running sandboxes are re-adopted (their agent answers again), sandboxes
// whose processes are gone are marked stopped with their filesystem kept (a
// dataplane request or start boots them again), half-made ones are marked
// failed, and interrupted snapshot builds are resumed.
func (m *Manager) Recover(ctx context.Context) error {
	sandboxes, err := m.cfg.Store.AllSandboxes(ctx)
	if err != nil {
		return err
	}
	for _, sb := range sandboxes {
		m.recoverSandbox(ctx, sb)
	}
	snaps, err := m.cfg.Store.SnapshotsWithStatus(ctx, protocol.SnapshotBuilding)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		bp := &buildProgress{}
		m.mu.Lock()
		m.builds[sn.ID] = bp
		m.mu.Unlock()
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			m.buildSnapshot(ctx, sn, nil, bp)
		}()
	}
	return nil
}

func (m *Manager) recoverSandbox(ctx context.Context, sb *store.Sandbox) {
	rid := runtimeID(sb.ID)
	log := m.log.With("sandbox", sb.ID, "name", sb.Name)
	switch sb.Status {
	case protocol.StatusReady:
		running, err := m.cfg.Driver.Running(ctx, rid)
		if err == nil && running {
			ep, err := m.cfg.Network.Lookup(ctx, rid)
			if err == nil {
				c := agent.NewClient(agentAddr(ep.SandboxIP), sb.Token)
				hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err = c.Health(hctx)
				cancel()
				if err == nil {
					err = m.egressRestore(ctx, sb, ep)
				}
				if err == nil {
					m.setAgent(sb.ID, c)
					m.watch(ctx, sb.ID, c)
					m.restoreActivity(sb) // neither reset nor zero the idle clock
					log.Info("re-adopted running sandbox")
					return
				}
			}
			log.Warn("running sandbox unreachable; stopping it", "err", err)
		}
		if err := m.halt(ctx, sb, "found not running after a daemon restart; the next request starts it again"); err != nil {
			log.Error("mark sandbox stopped", "err", err)
		}
	case protocol.StatusProvisioning:
		// The boot was interrupted: nothing of it can be trusted.
		_ = m.cfg.Driver.Stop(ctx, rid)
		_ = m.cfg.Network.Teardown(ctx, rid)
		_ = m.cfg.Storage.Unmount(ctx, rid)
		sb.Status, sb.StatusMessage, sb.UpdatedAt = protocol.StatusFailed, "daemon restarted during boot", time.Now().UTC()
		if err := m.cfg.Store.UpdateSandbox(ctx, sb); err != nil {
			log.Error("mark sandbox failed", "err", err)
		}
	}
}

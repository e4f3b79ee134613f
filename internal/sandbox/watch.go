package sandbox

import (
	"context"
	"errors"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"golang.org/x/sys/unix"
)

// watch notices when sandbox id dies on its own (its Sentry or PID 1 was
// OOM-killed, crashed, or was killed from the host). It waits on a pidfd of
// its runtime d's process, so it costs nothing while the sandbox lives and
// fires at once when it goes; Close wakes it through the manager's pipe
// and it ends without a verdict (the sandbox outlives the daemon). c is the
// agent client of the instance being watched: a deliberate stop or restart
// replaces it first, which tells died the exit was expected. It returns at
// once: finding the process (a runsc subprocess under gVisor, ~10 ms) is
// part of the background work, not of the boot a client waits for; an
// instance already gone by then has died.
func (m *Manager) watch(ctx context.Context, d runtime.Driver, id string, c *agent.Client) {
	ctx = context.WithoutCancel(ctx) // the boot's context ends before the sandbox does
	m.goBG(func() {
		pid, err := d.PID(ctx, runtimeID(id))
		if err != nil {
			m.log.Warn("cannot watch sandbox process", "sandbox", id, "err", err)
			return
		}
		if pid == 0 {
			if !m.closing() {
				m.died(ctx, d, id, c) // gone already (died checks it was not on purpose)
			}
			return
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			m.log.Warn("cannot watch sandbox process", "sandbox", id, "pid", pid, "err", err)
			return
		}
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(m.wakeR.Fd()), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); !errors.Is(err, unix.EINTR) {
				break
			}
		}
		if fds[0].Revents == 0 || m.closing() {
			return // the manager is closing
		}
		m.died(ctx, d, id, c)
	})
}

// died records that the instance behind c (on runtime d) exited unexpectedly: the sandbox
// becomes stopped (files kept) with a message saying why, and the next
// dataplane request or start boots it again.
func (m *Manager) died(ctx context.Context, d runtime.Driver, id string, c *agent.Client) {
	if cur, _ := m.instance(id); cur != c {
		return // stopped, deleted or restarted on purpose (checked again below)
	}
	sb, unlock, err := m.lockID(ctx, id)
	if err != nil {
		return
	}
	defer unlock()
	if cur, _ := m.instance(id); cur != c || statusOf(sb) != Ready {
		return // stopped, deleted or restarted on purpose
	}
	msg, reason := "sandbox exited unexpectedly; its files are kept and the next request starts it again", protocol.StopCrash
	if x, ok := d.(runtime.Explainer); ok {
		if cause := x.ExitCause(runtimeID(id)); cause != "" {
			msg = "sandbox exited unexpectedly (" + cause + "); its files are kept and the next request starts it again"
		}
	}
	if runtime.OOMKilled(runtimeID(id)) {
		msg, reason = "sandbox was killed for exceeding its memory limit (mem_bytes); its files are kept and the next request starts it again", protocol.StopOOM
	}
	m.log.Warn("sandbox died", "sandbox", id, "name", sb.Name, "reason", msg)
	if err := m.halt(ctx, sb, msg); err != nil {
		m.log.Error("clean up dead sandbox", "sandbox", id, "err", err)
		return
	}
	// The system stopped it, not whoever started the instance (ctx's caller).
	m.emit(context.Background(), sb, protocol.EventStopped, stopReason{Reason: reason, Message: msg})
}

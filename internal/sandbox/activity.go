package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// activity is the idle-TTL bookkeeping of one sandbox. What counts as
// activity (README, "Idle timeout: what counts as activity"):
//
//   - any API call naming the sandbox: control plane (get, status, patch,
//     start, stop) and dataplane (exec, files, search);
//   - every exec frame relayed in either direction;
//   - any request or exec stream still open (busy > 0): a silent command
//     with a client attached keeps the sandbox alive;
//   - any command the agent reports running, or a change in its commands
//     or their output since the last poll (commands started with wait:false
//     and left detached).
//
// Invariant: last only moves forward; flushed <= last is what the store
// holds, so a daemon restart resumes from at most one reap interval ago
// rather than resetting the clock or finding it at zero.
type activity struct {
	last    time.Time
	flushed time.Time
	busy    int            // open requests and exec streams
	agent   agent.Activity // the agent's answer at the last poll
	polled  bool
}

// act returns id's bookkeeping, creating it. Callers hold m.mu.
func (m *Manager) act(id string) *activity {
	a := m.acts[id]
	if a == nil {
		a = &activity{}
		m.acts[id] = a
	}
	return a
}

// touch records activity on sandbox id now.
func (m *Manager) touch(id string) {
	now := time.Now()
	m.mu.Lock()
	if a := m.act(id); now.After(a.last) {
		a.last = now
	}
	m.mu.Unlock()
}

// acquire marks a request or stream on sandbox id as open; release ends it.
// Both count as activity.
func (m *Manager) acquire(id string) (release func()) {
	m.mu.Lock()
	a := m.act(id)
	a.busy++
	a.last = time.Now()
	m.mu.Unlock()
	done := false
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if done {
			return
		}
		done = true
		a := m.act(id)
		a.busy--
		a.last = time.Now()
	}
}

// restoreActivity seeds id's bookkeeping from its record after a daemon
// restart: the persisted time, or the record's last update when none was
// persisted yet.
func (m *Manager) restoreActivity(sb *store.Sandbox) {
	t := sb.UpdatedAt
	if sb.LastActiveAt != nil && sb.LastActiveAt.After(t) {
		t = *sb.LastActiveAt
	}
	m.mu.Lock()
	a := m.act(sb.ID)
	if t.After(a.last) {
		a.last = t
	}
	if t.After(a.flushed) {
		a.flushed = t
	}
	m.mu.Unlock()
}

// idleFor reports how long sandbox id has been idle and whether a request
// or stream is open on it.
func (m *Manager) idleFor(id string, now time.Time, fallback time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.act(id)
	if a.last.IsZero() {
		a.last = fallback
	}
	return now.Sub(a.last), a.busy > 0
}

// claimIdle detaches sandbox id's agent if it has been idle since before
// cutoff and nothing is open on it, atomically with respect to acquire:
// a request that arrives afterwards finds no instance and waits on the
// sandbox lock (held by the reaper) to wake it again.
func (m *Manager) claimIdle(id string, cutoff time.Time) bool {
	m.mu.Lock()
	a := m.act(id)
	idle := a.busy == 0 && !a.last.After(cutoff)
	m.mu.Unlock()
	if !idle {
		return false
	}
	m.setAgent(id, nil)
	return true
}

// pollAgent asks sandbox id's agent about its commands and records
// activity if one is running or anything changed since the last poll.
func (m *Manager) pollAgent(ctx context.Context, id string) {
	c, _ := m.instance(id)
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	got, err := c.Activity(ctx)
	if err != nil {
		m.log.Debug("poll agent activity", "sandbox", id, "err", err)
		return
	}
	m.mu.Lock()
	a := m.act(id)
	if got.Running > 0 || (a.polled && got != a.agent) {
		a.last = time.Now()
	}
	a.agent, a.polled = got, true
	m.mu.Unlock()
}

// RunReaper enforces idle_ttl_seconds and delete_after_stop_seconds every
// ReapInterval until ctx ends.
func (m *Manager) RunReaper(ctx context.Context) {
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			m.flushActivity(context.WithoutCancel(ctx), nil)
			return
		case <-t.C:
			m.Reap(ctx)
		}
	}
}

// Reap runs one pass: stops ready sandboxes idle for idle_ttl_seconds,
// deletes stopped ones delete_after_stop_seconds after stopped_at, and
// persists activity.
func (m *Manager) Reap(ctx context.Context) {
	all, err := m.cfg.Store.AllSandboxes(ctx)
	if err != nil {
		m.log.Error("reap: list sandboxes", "err", err)
		return
	}
	for _, sb := range all {
		switch {
		case sb.Status == protocol.StatusReady && sb.IdleTTLSeconds > 0:
			m.reapIdle(ctx, sb)
		case sb.Status == protocol.StatusStopped && sb.DeleteAfterStopSeconds > 0 && sb.StoppedAt != nil &&
			time.Since(*sb.StoppedAt) >= time.Duration(sb.DeleteAfterStopSeconds)*time.Second:
			m.reapStopped(ctx, sb.ID)
		}
	}
	m.flushActivity(ctx, all)
}

func (m *Manager) reapIdle(ctx context.Context, sb *store.Sandbox) {
	ttl := time.Duration(sb.IdleTTLSeconds) * time.Second
	m.pollAgent(ctx, sb.ID)
	if idle, busy := m.idleFor(sb.ID, time.Now(), sb.UpdatedAt); busy || idle < ttl {
		return
	}
	unlock := m.lock(sb.ID)
	defer unlock()
	cur, err := m.cfg.Store.GetSandboxByID(ctx, sb.ID)
	if err != nil || cur.Status != protocol.StatusReady || cur.IdleTTLSeconds <= 0 {
		return
	}
	ttl = time.Duration(cur.IdleTTLSeconds) * time.Second
	if !m.claimIdle(cur.ID, time.Now().Add(-ttl)) {
		return
	}
	msg := fmt.Sprintf("stopped after %s without activity (idle_ttl_seconds=%d); the next request starts it again", ttl, cur.IdleTTLSeconds)
	m.log.Info("idle sandbox stopped", "sandbox", cur.ID, "name", cur.Name, "idle_ttl", ttl)
	if err := m.halt(ctx, cur, msg); err != nil {
		m.log.Error("stop idle sandbox", "sandbox", cur.ID, "err", err)
	}
}

func (m *Manager) reapStopped(ctx context.Context, id string) {
	unlock := m.lock(id)
	defer unlock()
	cur, err := m.cfg.Store.GetSandboxByID(ctx, id)
	if err != nil || cur.Status != protocol.StatusStopped || cur.DeleteAfterStopSeconds <= 0 || cur.StoppedAt == nil ||
		time.Since(*cur.StoppedAt) < time.Duration(cur.DeleteAfterStopSeconds)*time.Second {
		return
	}
	m.log.Info("stopped sandbox deleted", "sandbox", cur.ID, "name", cur.Name, "delete_after_stop_seconds", cur.DeleteAfterStopSeconds)
	if err := m.destroy(ctx, cur); err != nil {
		m.log.Error("delete stopped sandbox", "sandbox", cur.ID, "err", err)
	}
}

// flushActivity persists activity newer than what the store holds. With
// the full record list, it also forgets bookkeeping of deleted sandboxes.
func (m *Manager) flushActivity(ctx context.Context, all []*store.Sandbox) {
	type pending struct {
		id string
		at time.Time
	}
	var todo []pending
	m.mu.Lock()
	if all != nil {
		exists := make(map[string]bool, len(all))
		for _, sb := range all {
			exists[sb.ID] = true
		}
		for id, a := range m.acts {
			if !exists[id] && a.busy == 0 {
				delete(m.acts, id)
			}
		}
	}
	for id, a := range m.acts {
		if a.last.After(a.flushed) {
			todo = append(todo, pending{id, a.last})
		}
	}
	m.mu.Unlock()
	for _, p := range todo {
		if err := m.cfg.Store.SetSandboxActivity(ctx, p.id, p.at); err != nil {
			m.log.Warn("persist sandbox activity", "sandbox", p.id, "err", err)
			continue
		}
		m.mu.Lock()
		if a := m.acts[p.id]; a != nil && p.at.After(a.flushed) {
			a.flushed = p.at
		}
		m.mu.Unlock()
	}
}

package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// The idle/TTL reaper. It observes activity — recorded by touch and
// acquire (box.go) wherever a call names a sandbox — and never sits in a
// call's path: every ReapInterval it stops ready sandboxes idle for their
// idle_ttl_seconds and deletes stopped ones delete_after_stop_seconds
// after stopped_at, through the same transitions as the API.

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

// restoreActivity seeds id's bookkeeping from its record after a daemon
// restart: the persisted time, or the record's last update when none was
// persisted yet.
func (m *Manager) restoreActivity(sb *store.Sandbox) {
	t := sb.UpdatedAt
	if sb.LastActiveAt != nil && sb.LastActiveAt.After(t) {
		t = *sb.LastActiveAt
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := &m.boxLocked(sb.ID).act
	if t.After(a.last) {
		a.last = t
	}
	if t.After(a.flushed) {
		a.flushed = t
	}
}

// idleFor reports how long sandbox id has been idle and whether a request
// or stream is open on it.
func (m *Manager) idleFor(id string, now time.Time, fallback time.Time) (time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := &m.boxLocked(id).act
	if a.last.IsZero() {
		a.last = fallback
	}
	return now.Sub(a.last), a.busy > 0
}

// claimIdle detaches sandbox id's agent if it has been idle since before
// cutoff and nothing is open on it. The check and the detach are one
// critical section of m.mu, the one acquire takes: a request that
// acquires first keeps the instance; one that acquires after finds no
// instance and waits on the lifecycle lock (held by the reaper) to wake
// the sandbox again.
func (m *Manager) claimIdle(id string, cutoff time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.boxLocked(id)
	if b.act.busy > 0 || b.act.last.After(cutoff) {
		return false
	}
	b.setAgentLocked(nil)
	return true
}

// pollAgent asks sandbox id's agent about its commands and records
// activity: now if one is running, else when the agent says a command last
// changed (an agent without changed_ms_ago: now, if its answer differs
// from the last one). It is called only for a sandbox already due to stop,
// so an idle sandbox's agent is not woken once per reap interval (under
// gVisor each wakeup costs host CPU; about 5 ms per poll).
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
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	a := &m.boxLocked(id).act
	seen := now
	switch {
	case got.Running > 0:
	case got.ChangedMsAgo != nil:
		seen = now.Add(-time.Duration(*got.ChangedMsAgo) * time.Millisecond)
	case !a.polled || got == a.agent:
		seen = time.Time{}
	}
	if seen.After(a.last) {
		a.last = seen
	}
	got.ChangedMsAgo = nil // compared with the next answer by value
	a.agent, a.polled = got, true
}

// StartReaper runs the reaper every ReapInterval until ctx ends or the
// manager closes; Close waits for it and flushes activity a last time.
func (m *Manager) StartReaper(ctx context.Context) {
	m.goBG(func() {
		t := time.NewTicker(m.cfg.ReapInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				m.flushActivity(ctx, nil)
				return
			case <-m.life.Done():
				m.flushActivity(ctx, nil)
				return
			case <-t.C:
				m.Reap(ctx)
			}
		}
	})
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
		case statusOf(sb) == Ready && sb.IdleTTLSeconds > 0:
			m.reapIdle(ctx, sb)
		case stopTTLDue(sb):
			m.reapStopped(ctx, sb.ID)
		}
	}
	m.flushActivity(ctx, all)
}

// stopTTLDue reports whether stopped sb is due for deletion.
func stopTTLDue(sb *store.Sandbox) bool {
	return statusOf(sb) == Stopped && sb.DeleteAfterStopSeconds > 0 && sb.StoppedAt != nil &&
		time.Since(*sb.StoppedAt) >= time.Duration(sb.DeleteAfterStopSeconds)*time.Second
}

func (m *Manager) reapIdle(ctx context.Context, sb *store.Sandbox) {
	ttl := time.Duration(sb.IdleTTLSeconds) * time.Second
	due := func() bool {
		idle, busy := m.idleFor(sb.ID, time.Now(), sb.UpdatedAt)
		return !busy && idle >= ttl
	}
	if !due() {
		return
	}
	if m.pollAgent(ctx, sb.ID); !due() {
		return
	}
	cur, unlock, err := m.lockID(ctx, sb.ID)
	if err != nil {
		return
	}
	defer unlock()
	if requireStatus(cur, opIdleStop) != nil || cur.IdleTTLSeconds <= 0 {
		return
	}
	ttl = time.Duration(cur.IdleTTLSeconds) * time.Second
	if !m.claimIdle(cur.ID, time.Now().Add(-ttl)) {
		return
	}
	msg := fmt.Sprintf("stopped after %s without activity (idle_ttl_seconds=%d); the next request starts it again", ttl, cur.IdleTTLSeconds)
	m.log.Info("idle sandbox stopped", "sandbox", cur.ID, "name", cur.Name, "idle_ttl", ttl)
	if err := m.stop(ctx, cur, msg); err != nil {
		m.log.Error("stop idle sandbox", "sandbox", cur.ID, "err", err)
		return
	}
	m.emit(ctx, cur, protocol.EventStopped, stopReason{Reason: protocol.StopIdle, Message: msg})
}

func (m *Manager) reapStopped(ctx context.Context, id string) {
	cur, unlock, err := m.lockID(ctx, id)
	if err != nil {
		return
	}
	defer unlock()
	if requireStatus(cur, opTTLStop) != nil || !stopTTLDue(cur) {
		return
	}
	m.log.Info("stopped sandbox deleted", "sandbox", cur.ID, "name", cur.Name, "delete_after_stop_seconds", cur.DeleteAfterStopSeconds)
	if err := m.destroy(ctx, cur); err != nil {
		m.log.Error("delete stopped sandbox", "sandbox", cur.ID, "err", err)
		return
	}
	m.emit(ctx, cur, protocol.EventDeleted, map[string]string{"reason": "delete_after_stop_seconds"})
}

// flushActivity persists activity newer than what the store holds, on a
// context detached from ctx (it runs at shutdown too). With the full
// record list, it also forgets boxes of deleted sandboxes.
func (m *Manager) flushActivity(ctx context.Context, all []*store.Sandbox) {
	type pending struct {
		id string
		a  *activity
		at time.Time
	}
	var todo []pending
	m.mu.Lock()
	if all != nil {
		exists := make(map[string]bool, len(all))
		for _, sb := range all {
			exists[sb.ID] = true
		}
		for id, b := range m.boxes {
			if !exists[id] && b.idleBoxLocked() {
				delete(m.boxes, id)
			}
		}
	}
	for id, b := range m.boxes {
		if b.act.last.After(b.act.flushed) {
			todo = append(todo, pending{id, &b.act, b.act.last})
		}
	}
	m.mu.Unlock()
	ctx, cancel := outcomeContext(ctx)
	defer cancel()
	for _, p := range todo {
		if err := m.cfg.Store.SetSandboxActivity(ctx, p.id, p.at); err != nil {
			m.log.Warn("persist sandbox activity", "sandbox", p.id, "err", err)
			continue
		}
		m.mu.Lock()
		if p.at.After(p.a.flushed) {
			p.a.flushed = p.at
		}
		m.mu.Unlock()
	}
}

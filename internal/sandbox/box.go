package sandbox

import (
	"context"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/keyed"
)

// box is the daemon's in-memory state of one sandbox: the one home of
// everything about it that is not in its record.
//
// Lock order: box.lock, then Manager.mu. box.lock is the lifecycle lock:
// it is held across a whole transition (boot, halt, destroy, capture,
// reset) and taken with the caller's context, so a waiting request gives
// up when its client goes. Manager.mu guards the boxes map and the fields
// below; it is a leaf, held only for field updates, never across I/O or
// while waiting for a box.lock. Readers of the fields (instance, touch,
// acquire) take only Manager.mu, so they never wait on a boot. A
// workspace's quota lock (quota.go) comes between the two: box.lock, then
// the quota lock, then Manager.mu.
type box struct {
	lock *keyed.Mutex

	// Guarded by Manager.mu.
	holders int           // holders and waiters of lock: a box is forgotten only at 0
	agent   *agent.Client // the running instance's agent, nil when none
	gone    chan struct{} // closed when that instance goes; nil when none
	act     activity      // idle-TTL bookkeeping (reaper.go)
	volumes []string      // ids of the volumes the running instance mounts (volumes.go)
}

// boxLocked returns id's box, creating it. Callers hold m.mu.
func (m *Manager) boxLocked(id string) *box {
	b := m.boxes[id]
	if b == nil {
		b = &box{lock: keyed.NewMutex()}
		m.boxes[id] = b
	}
	return b
}

// lock takes sandbox id's lifecycle lock, or returns ctx's error when ctx
// ends first. Whoever takes it must reload the record: it may have
// changed, or gone, while waiting.
func (m *Manager) lock(ctx context.Context, id string) (unlock func(), err error) {
	m.mu.Lock()
	b := m.boxLocked(id)
	b.holders++
	m.mu.Unlock()
	done := func() {
		m.mu.Lock()
		b.holders--
		m.mu.Unlock()
	}
	if err := b.lock.Lock(ctx); err != nil {
		done()
		return nil, err
	}
	return func() { b.lock.Unlock(); done() }, nil
}

// setAgentLocked makes c the agent of id's running instance, or with nil
// records that the instance is gone, which closes gone and so ends every
// stream relayed to it. Callers hold m.mu.
func (b *box) setAgentLocked(c *agent.Client) {
	if b.gone != nil {
		close(b.gone)
		b.gone = nil
	}
	if b.agent != nil {
		b.agent.Close()
	}
	b.agent = c
	if c != nil {
		b.gone = make(chan struct{})
	}
}

// setAgent is setAgentLocked for callers not holding m.mu.
func (m *Manager) setAgent(id string, c *agent.Client) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.boxLocked(id).setAgentLocked(c)
}

// instance returns the agent client of sandbox id's running instance and a
// channel closed when that instance goes, or nil.
func (m *Manager) instance(id string) (*agent.Client, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b := m.boxes[id]; b != nil {
		return b.agent, b.gone
	}
	return nil, nil
}

// forget drops id's box once its record is deleted. Callers hold id's
// lifecycle lock; whoever waits on it gets it and finds the record gone
// (ids are never reused, so a later box for id guards nothing).
func (m *Manager) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b := m.boxes[id]; b != nil {
		b.setAgentLocked(nil)
		delete(m.boxes, id)
	}
}

// idleBoxLocked reports whether b holds nothing worth keeping once its
// record is gone. Callers hold m.mu.
func (b *box) idleBoxLocked() bool {
	return b.holders == 0 && b.act.busy == 0 && b.agent == nil
}

// touch records activity on sandbox id now.
func (m *Manager) touch(id string) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if a := &m.boxLocked(id).act; now.After(a.last) {
		a.last = now
	}
}

// acquire marks a request or stream on sandbox id as open; release ends it.
// Both count as activity. A box is never forgotten while busy.
func (m *Manager) acquire(id string) (release func()) {
	release, _, _ = m.acquireInstance(id)
	return release
}

// acquireInstance is acquire that also returns id's running instance (as
// instance does), in the same critical section: the idle reaper's claim
// either runs before (no instance is returned) or sees the sandbox busy.
func (m *Manager) acquireInstance(id string) (release func(), c *agent.Client, gone <-chan struct{}) {
	m.mu.Lock()
	b := m.boxLocked(id)
	a := &b.act // kept: release must count down this box, even once forgotten
	a.busy++
	a.last = time.Now()
	c, gone = b.agent, b.gone
	m.mu.Unlock()
	done := false
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if done {
			return
		}
		done = true
		a.busy--
		a.last = time.Now()
	}, c, gone
}

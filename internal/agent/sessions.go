package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"
)

// expiredMemory is how long the id of an expired session is remembered, so a
// late reconnect hears SessionExpired rather than CommandNotFound.
const expiredMemory = time.Hour

var (
	errSessionNotFound = errors.New("no command with this id")
	errSessionExpired  = errors.New("command finished and its output has expired")
)

// sessionTable indexes sessions by command id. Invariant: an id is in at most
// one of live and expired; a session leaves live only through expire. Lock
// order: t.mu before a session's mu.
type sessionTable struct {
	bufMax int

	mu      sync.Mutex
	live    map[string]*session
	expired map[string]time.Time
	// expiredChange is the latest changeAt of the sessions that expired,
	// so a command that started and ended between two activity polls
	// still counts.
	expiredChange time.Time
}

func newSessionTable(bufMax int) *sessionTable {
	return &sessionTable{bufMax: bufMax, live: map[string]*session{}, expired: map[string]time.Time{}}
}

// getOrCreate returns the session for id, creating an unstarted one (created
// true) if there is none. The creator must start it or call abandon.
func (t *sessionTable) getOrCreate(id string) (s *session, created bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.live[id]; s != nil {
		return s, false, nil
	}
	if _, ok := t.expired[id]; ok {
		return nil, false, errSessionExpired
	}
	s = newSession(id, t.bufMax)
	t.live[id] = s
	return s, true, nil
}

// lookup returns the live session for id.
func (t *sessionTable) lookup(id string) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.live[id]; s != nil {
		return s, nil
	}
	if _, ok := t.expired[id]; ok {
		return nil, errSessionExpired
	}
	return nil, errSessionNotFound
}

// abandon forgets a session whose command could not be started, so a retry
// with the same id tries again.
func (t *sessionTable) abandon(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live[s.id] == s {
		delete(t.live, s.id)
	}
}

// finished schedules the expiry of a finished session after its TTL.
func (t *sessionTable) finished(s *session) {
	if s.ttl < 0 {
		return
	}
	time.AfterFunc(s.ttl, func() { t.expire(s) })
}

func (t *sessionTable) expire(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.live[s.id] != s {
		return
	}
	delete(t.live, s.id)
	s.mu.Lock()
	if s.changeAt.After(t.expiredChange) {
		t.expiredChange = s.changeAt
	}
	s.mu.Unlock()
	now := time.Now()
	for id, at := range t.expired {
		if now.Sub(at) > expiredMemory {
			delete(t.expired, id)
		}
	}
	t.expired[s.id] = now
}

// byGroup returns the running session whose command leads process group
// pgid or session sid, or nil.
func (t *sessionTable) byGroup(sid, pgid int) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.live {
		select {
		case <-s.ready:
		default:
			continue
		}
		if s.startErr == nil && s.proc != nil && (s.proc.pid == pgid || s.proc.pid == sid) {
			return s
		}
	}
	return nil
}

// killAll kills every running command (agent shutdown).
func (t *sessionTable) killAll() {
	t.mu.Lock()
	all := make([]*session, 0, len(t.live))
	for _, s := range t.live {
		all = append(all, s)
	}
	t.mu.Unlock()
	for _, s := range all {
		select {
		case <-s.ready:
			if s.startErr == nil {
				s.kill()
			}
		default:
		}
	}
}

// newCommandID returns a random id for an execute frame that carried none.
func newCommandID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Package keyed provides the daemon's one per-key lock: a mutex whose
// waiters give up when their context ends, held in a map that keeps an
// entry only while someone holds or waits for it (so locks of deleted
// sandboxes, layers or endpoints never pile up).
package keyed

import (
	"context"
	"sync"
)

// Mutex is a mutual-exclusion lock whose Lock honours a context. The zero
// value is not ready: use NewMutex.
type Mutex struct{ ch chan struct{} }

// NewMutex returns an unlocked Mutex.
func NewMutex() *Mutex { return &Mutex{ch: make(chan struct{}, 1)} }

// Lock takes the mutex, or returns ctx's error if ctx ends first.
func (m *Mutex) Lock(ctx context.Context) error {
	select {
	case m.ch <- struct{}{}:
		return nil
	default:
	}
	select {
	case m.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Unlock releases the mutex. It must be held.
func (m *Mutex) Unlock() { <-m.ch }

// Locks is a set of Mutexes by key. The zero value is ready to use.
type Locks[K comparable] struct {
	mu sync.Mutex
	m  map[K]*entry
}

type entry struct {
	mu   *Mutex
	refs int // holders and waiters
}

// Lock takes key's lock, waiting until it is free or ctx ends. The returned
// func releases it; call it exactly once.
func (l *Locks[K]) Lock(ctx context.Context, key K) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[K]*entry{}
	}
	e := l.m[key]
	if e == nil {
		e = &entry{mu: NewMutex()}
		l.m[key] = e
	}
	e.refs++
	l.mu.Unlock()
	if err := e.mu.Lock(ctx); err != nil {
		l.drop(key, e)
		return nil, err
	}
	return func() {
		e.mu.Unlock()
		l.drop(key, e)
	}, nil
}

// Wait waits until nobody holds key's lock (a transition in progress
// ends) without keeping it, or until ctx ends.
func (l *Locks[K]) Wait(ctx context.Context, key K) error {
	unlock, err := l.Lock(ctx, key)
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// Len reports how many keys have an entry (held or awaited), for tests.
func (l *Locks[K]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

func (l *Locks[K]) drop(key K, e *entry) {
	l.mu.Lock()
	if e.refs--; e.refs == 0 {
		delete(l.m, key)
	}
	l.mu.Unlock()
}

package sandboxtest

import (
	"context"
	"sync"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/record"
)

// Recorded is one event a Recorder received, with the caller it was
// recorded for ("system" when ctx carried none).
type Recorded struct {
	record.Event
	Actor string
}

// Recorder is an in-memory sandbox.Recorder: it keeps every event in order.
type Recorder struct {
	mu     sync.Mutex
	events []Recorded
}

// Record implements sandbox.Recorder.
func (r *Recorder) Record(ctx context.Context, e record.Event) {
	actor := "system"
	if p, ok := auth.FromContext(ctx); ok {
		actor = p.User
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, Recorded{Event: e, Actor: actor})
}

// Events returns sandboxID's events so far, oldest first.
func (r *Recorder) Events(sandboxID string) []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Recorded
	for _, e := range r.events {
		if e.SandboxID == sandboxID {
			out = append(out, e)
		}
	}
	return out
}

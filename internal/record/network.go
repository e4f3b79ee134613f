package record

import (
	"context"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Network events come from the daemon's side of a sandbox's traffic (the
// egress proxy, its resolver, conntrack), never from the agent. They are
// attributed to a step by when the connection (or query) began: the step
// of the only command of the sandbox running then; step 0 when none was,
// or several were (the daemon cannot tell which process opened it).
//
// A sandbox can open connections far faster than anyone reads a record,
// so each sandbox's network events pass a token bucket (NetBurst events,
// refilled at NetRate a second); what it refuses is counted and reported
// as dropped_before on the sandbox's next network event.
const (
	NetRate  = 100
	NetBurst = 1000
)

// netBucket is one sandbox's network event budget. Guarded by Recorder.mu.
type netBucket struct {
	tokens  float64
	last    time.Time
	dropped int64
}

// take spends a token at now, or counts a drop.
func (b *netBucket) take(now time.Time) bool {
	b.tokens = min(NetBurst, b.tokens+now.Sub(b.last).Seconds()*NetRate)
	b.last = now
	if b.tokens < 1 {
		b.dropped++
		return false
	}
	b.tokens--
	return true
}

// Network records a network event of typ (protocol.EventNetwork*) for
// sandboxID, begun at at (zero: now), which picks its step. data becomes
// the event's object, with dropped_before added when the sandbox's
// earlier events were refused by its rate bound.
func (r *Recorder) Network(ctx context.Context, sandboxID, workspaceID, typ string, at time.Time, data map[string]any) {
	now := time.Now()
	if at.IsZero() {
		at = now
	}
	r.mu.Lock()
	b := r.nets[sandboxID]
	if b == nil {
		b = &netBucket{tokens: NetBurst, last: now}
		r.nets[sandboxID] = b
	}
	ok := b.take(now)
	var dropped int64
	if ok {
		dropped, b.dropped = b.dropped, 0
	}
	step := r.stepAtLocked(sandboxID, at)
	r.mu.Unlock()
	if !ok {
		return
	}
	if dropped > 0 {
		data["dropped_before"] = dropped
	}
	r.record(ctx, Event{SandboxID: sandboxID, WorkspaceID: workspaceID, Kind: protocol.KindNetwork, Type: typ, Step: step, Data: data})
}

// span is when one command ran; end is zero while it runs.
type span struct {
	c          *Command
	start, end time.Time
}

// Spans of ended commands are kept spanKeep (a connection is recorded
// when it closes, which may be after its command ended), at most spanMax
// per sandbox.
const (
	spanKeep = 10 * time.Minute
	spanMax  = 64
)

// stepAtLocked is the step of the only command of sandboxID running at
// t, or 0 for none or several. Callers hold mu.
func (r *Recorder) stepAtLocked(sandboxID string, t time.Time) int64 {
	var step int64
	n := 0
	for _, s := range r.spans[sandboxID] {
		if !t.Before(s.start) && (s.end.IsZero() || !t.After(s.end)) {
			step = s.c.step
			n++
		}
	}
	if n != 1 {
		return 0
	}
	return step
}

// runStart and runEnd keep when each command of a sandbox ran (with or
// without a command id), which network events are attributed by.
func (r *Recorder) runStart(c *Command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	spans := r.spans[c.key.sandbox]
	// Forget ended spans past spanKeep, and the oldest past spanMax.
	kept := spans[:0]
	for _, s := range spans {
		if s.end.IsZero() || c.start.Sub(s.end) < spanKeep {
			kept = append(kept, s)
		}
	}
	if len(kept) >= spanMax {
		kept = kept[len(kept)-spanMax+1:]
	}
	r.spans[c.key.sandbox] = append(kept, &span{c: c, start: c.start})
}

func (r *Recorder) runEnd(c *Command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans[c.key.sandbox] {
		if s.c == c {
			s.end = time.Now()
		}
	}
}

// forgetNetwork drops sandboxID's rate bound and command spans when it
// stops: nothing of it runs any more.
func (r *Recorder) forgetNetwork(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.nets, sandboxID)
	delete(r.spans, sandboxID)
}

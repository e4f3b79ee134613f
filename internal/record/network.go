package record

import (
	"context"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Network events come from the daemon's side of a sandbox's traffic (the
// egress proxy, its resolver, conntrack), never from the agent. They are
// attributed to a step by time: while exactly one command of the sandbox
// is running, its step; otherwise (none, or several at once, where the
// daemon cannot tell which process opened a connection) step 0.
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
// sandboxID. data is marshalled as the event's object, with
// dropped_before added when the sandbox's earlier events were refused by
// its rate bound; it must marshal to a JSON object.
func (r *Recorder) Network(ctx context.Context, sandboxID, workspaceID, typ string, data map[string]any) {
	r.mu.Lock()
	b := r.nets[sandboxID]
	if b == nil {
		b = &netBucket{tokens: NetBurst, last: time.Now()}
		r.nets[sandboxID] = b
	}
	ok := b.take(time.Now())
	var dropped int64
	if ok {
		dropped, b.dropped = b.dropped, 0
	}
	step := r.runningStepLocked(sandboxID)
	r.mu.Unlock()
	if !ok {
		return
	}
	if dropped > 0 {
		data["dropped_before"] = dropped
	}
	r.record(ctx, Event{SandboxID: sandboxID, WorkspaceID: workspaceID, Kind: protocol.KindNetwork, Type: typ, Step: step, Data: data})
}

// runningStepLocked is the step of sandboxID's only running command, or 0.
// Callers hold mu.
func (r *Recorder) runningStepLocked(sandboxID string) int64 {
	run := r.running[sandboxID]
	if len(run) != 1 {
		return 0
	}
	for c := range run {
		return c.step
	}
	return 0
}

// runStart and runEnd keep the set of running commands per sandbox (with
// or without a command id) that network events are attributed to.
func (r *Recorder) runStart(c *Command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running[c.key.sandbox] == nil {
		r.running[c.key.sandbox] = map[*Command]struct{}{}
	}
	r.running[c.key.sandbox][c] = struct{}{}
}

func (r *Recorder) runEnd(c *Command) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.running[c.key.sandbox], c)
	if len(r.running[c.key.sandbox]) == 0 {
		delete(r.running, c.key.sandbox)
	}
}

// forgetNetwork drops sandboxID's rate bound and running commands when
// it stops: nothing of it runs any more.
func (r *Recorder) forgetNetwork(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.nets, sandboxID)
	delete(r.running, sandboxID)
}

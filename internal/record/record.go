// Package record keeps every sandbox's audit record: one durable, ordered
// stream of events per sandbox (lifecycle, commands, and later files,
// network and packages), with each command's captured output.
//
// The daemon is its only source: the manager reports lifecycle events, the
// dataplane reports what passes through it on the way to and from the
// untrusted in-sandbox agent. Writes are off the request path: Record
// assigns the event its seq, publishes it to live followers and queues it;
// one writer goroutine inserts queued events in batches at most
// FlushInterval after they were recorded, and everything queued at Close.
// A full queue drops events (counted by Dropped) rather than stalling a
// request. Records outlive their sandboxes and are pruned after Retention.
package record

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Store is where records are kept: *store.SQLite implements it over the
// control-plane database.
type Store interface {
	AppendAuditEvents(ctx context.Context, evs []protocol.AuditEvent, outs []store.AuditOutput) error
	AuditEvents(ctx context.Context, q store.AuditQuery) ([]protocol.AuditEvent, error)
	MaxAuditSeq(ctx context.Context, sandboxID string) (seq int64, workspaceID string, err error)
	AuditOutputs(ctx context.Context, sandboxID string, step int64) ([]store.AuditOutput, error)
	PruneAudit(ctx context.Context, cutoff time.Time) (int64, error)
}

var _ Store = (*store.SQLite)(nil)

// Event is what a caller records; the Recorder stamps seq, time and actor
// (the API caller in ctx, or system).
type Event struct {
	SandboxID   string
	WorkspaceID string
	Kind        string
	Type        string
	Step        int64
	// Data is marshalled to the event's JSON object; nil for none.
	Data any
}

// Options tune a Recorder; zero fields take the defaults.
type Options struct {
	// Retention is how long events and output are kept (default 30 days).
	Retention time.Duration
	// PruneInterval is how often expired records are deleted (default 1 h).
	PruneInterval time.Duration
	// FlushInterval bounds how long a recorded event waits to be written
	// (default 200 ms): the loss window of a daemon killed with SIGKILL.
	FlushInterval time.Duration
	// Buffer is how many events and outputs may wait to be written before
	// new ones are dropped (default 8192).
	Buffer int
	// OutputCap is the bytes of each command output stream kept, head and
	// tail halves (default DefaultOutputCap).
	OutputCap int
	// Exporters get every event once it has been written (or failed to
	// be), in the order recorded; Close closes them.
	Exporters []Exporter
	Logger    *slog.Logger
}

// Exporter sends events to a system outside the daemon (a JSONL file, an
// OpenTelemetry collector): internal/record/export. Export is called by
// the Recorder's one writer goroutine, with batches in record order, so
// it must not block for long; Close flushes what it holds.
type Exporter interface {
	Export(evs []protocol.AuditEvent)
	Close() error
}

// Defaults of Options.
const (
	DefaultRetention     = 30 * 24 * time.Hour
	DefaultFlushInterval = 200 * time.Millisecond
	defaultBuffer        = 8192
	defaultPrune         = time.Hour
	// batchMax bounds one insert transaction.
	batchMax = 512
	// followBuffer is how far a live follower may lag before it is cut
	// off (it then catches up from the store).
	followBuffer = 1024
)

// item is one unit of the write queue: an event, an output stream, or a
// flush request (closed once everything queued before it is written).
type item struct {
	ev    *protocol.AuditEvent
	out   *store.AuditOutput
	flush chan struct{}
}

// Recorder owns the record. Safe for concurrent use.
//
// Invariant: every send on q happens under mu with closed false, so Close
// (which sets closed and closes q under mu) never races a send.
type Recorder struct {
	st  Store
	opt Options
	log *slog.Logger

	mu     sync.Mutex
	closed bool
	seqs   map[string]int64                  // last seq per sandbox seen this run
	subs   map[string]map[*follower]struct{} // live followers per sandbox
	ended  bool                              // EndFollowers was called
	cmds   map[cmdKey]*Command               // open commands
	files  FileWatcher                       // nil: no file events
	// spans holds when each recent command of a sandbox ran (also those
	// without an id), nets each sandbox's network event budget.
	spans map[string][]*span
	nets  map[string]*netBucket
	q     chan item

	dropped   atomic.Uint64
	stopPrune chan struct{}
	wg        sync.WaitGroup
}

// New returns a Recorder writing to st and starts its writer and pruner.
// Close it before closing st.
func New(st Store, opt Options) *Recorder {
	if opt.Retention <= 0 {
		opt.Retention = DefaultRetention
	}
	if opt.PruneInterval <= 0 {
		opt.PruneInterval = defaultPrune
	}
	if opt.FlushInterval <= 0 {
		opt.FlushInterval = DefaultFlushInterval
	}
	if opt.Buffer <= 0 {
		opt.Buffer = defaultBuffer
	}
	if opt.OutputCap <= 0 {
		opt.OutputCap = DefaultOutputCap
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	r := &Recorder{st: st, opt: opt, log: opt.Logger,
		seqs: map[string]int64{}, subs: map[string]map[*follower]struct{}{}, cmds: map[cmdKey]*Command{},
		spans: map[string][]*span{}, nets: map[string]*netBucket{},
		q: make(chan item, opt.Buffer), stopPrune: make(chan struct{})}
	r.wg.Add(2)
	go r.write()
	go r.prune()
	return r
}

// Close writes everything recorded so far and stops the Recorder; events
// recorded after it are dropped.
func (r *Recorder) Close() {
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		close(r.q)
		close(r.stopPrune)
	}
	r.mu.Unlock()
	r.wg.Wait()
	for _, x := range r.opt.Exporters {
		if err := x.Close(); err != nil {
			r.log.Error("record: close exporter", "err", err)
		}
	}
	r.opt.Exporters = nil
}

// Dropped is how many events and outputs were lost to a full queue.
func (r *Recorder) Dropped() uint64 { return r.dropped.Load() }

// FileWatcher records what commands change in their sandbox's files
// (internal/filerec implements it). Only CommandStarting may block, and
// only briefly: it lets earlier scans of the sandbox finish first.
type FileWatcher interface {
	// CommandStarting is called before a command is sent to the agent
	// (Recorder.BeforeCommand).
	CommandStarting(ctx context.Context, sandboxID string)
	// CommandEnded is called once the end of command step is recorded.
	CommandEnded(ctx context.Context, sandboxID, workspaceID string, step int64)
	// Lifecycle is called once lifecycle event e is recorded, and once
	// a file API upload is (what it wrote is not a command's doing).
	Lifecycle(ctx context.Context, e Event)
}

// WatchFiles makes w see every command and lifecycle event from now on.
func (r *Recorder) WatchFiles(w FileWatcher) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.files = w
}

func (r *Recorder) fileWatcher() FileWatcher {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.files
}

// Record adds e to its sandbox's record. Ending (stopped, deleted) a
// sandbox first ends its open commands: their output is gone with the
// instance.
func (r *Recorder) Record(ctx context.Context, e Event) {
	if e.Kind == protocol.KindLifecycle && (e.Type == protocol.EventStopped || e.Type == protocol.EventDeleted) {
		r.endCommands(ctx, e.SandboxID, e.Type)
		r.forgetNetwork(e.SandboxID)
	}
	r.record(ctx, e)
	if w := r.fileWatcher(); w != nil && (e.Kind == protocol.KindLifecycle || e.Type == protocol.EventFileUploaded) {
		w.Lifecycle(ctx, e)
	}
}

// record is Record returning the event's seq (0 when it was dropped).
func (r *Recorder) record(ctx context.Context, e Event) int64 {
	ev := protocol.AuditEvent{Time: time.Now().UTC(), SandboxID: e.SandboxID, WorkspaceID: e.WorkspaceID,
		Kind: e.Kind, Type: e.Type, Step: e.Step, Actor: actorOf(ctx)}
	if e.Data != nil {
		b, err := json.Marshal(e.Data)
		if err != nil {
			r.log.Error("record: encode event data", "sandbox", e.SandboxID, "type", e.Type, "err", err)
		} else {
			ev.Data = b
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.drop()
		return 0
	}
	last, ok := r.seqs[e.SandboxID]
	// A created event starts its sandbox's record (ids are never reused):
	// no need to ask the store, on the create path.
	if !ok && e.Type != protocol.EventCreated {
		var err error
		if last, _, err = r.st.MaxAuditSeq(context.WithoutCancel(ctx), e.SandboxID); err != nil {
			r.log.Error("record: read last seq", "sandbox", e.SandboxID, "err", err)
			r.drop()
			return 0
		}
	}
	ev.Seq = last + 1
	r.seqs[e.SandboxID] = ev.Seq
	if e.Type == protocol.EventCommandStarted {
		ev.Step = ev.Seq // a command's step is the seq of its start
	}
	if !r.enqueueLocked(item{ev: &ev}) {
		return 0
	}
	for f := range r.subs[e.SandboxID] {
		f.sendLocked(ev)
	}
	return ev.Seq
}

// actorOf is the API caller in ctx, or system.
func actorOf(ctx context.Context) protocol.Actor {
	if p, ok := auth.FromContext(ctx); ok {
		return protocol.Actor{User: p.User, KeyPrefix: p.KeyPrefix}
	}
	return protocol.Actor{User: protocol.ActorSystem}
}

// enqueueLocked queues it without blocking, counting it dropped when the
// queue is full. Callers hold mu and have checked closed.
func (r *Recorder) enqueueLocked(it item) bool {
	select {
	case r.q <- it:
		return true
	default:
		r.drop()
		return false
	}
}

func (r *Recorder) drop() {
	if n := r.dropped.Add(1); n == 1 || n%1000 == 0 {
		r.log.Warn("record: events dropped (write queue full or closed)", "dropped", n)
	}
}

// saveOutput queues a command's output stream.
func (r *Recorder) saveOutput(o store.AuditOutput) {
	o.Time = time.Now().UTC()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.drop()
		return
	}
	r.enqueueLocked(item{out: &o})
}

// Flush waits until everything recorded before it is written (or ctx
// ends), so a read sees its own writes.
func (r *Recorder) Flush(ctx context.Context) error {
	done := make(chan struct{})
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return nil // Close wrote everything
		}
		var queued bool
		select {
		case r.q <- item{flush: done}:
			queued = true
		default:
		}
		r.mu.Unlock()
		if queued {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// write is the writer goroutine: it batches queued items and inserts a
// batch when it is full, FlushInterval after its first item, at a flush
// request, and at Close.
func (r *Recorder) write() {
	defer r.wg.Done()
	var (
		evs     []protocol.AuditEvent
		outs    []store.AuditOutput
		waiters []chan struct{}
		timer   *time.Timer
		due     <-chan time.Time
	)
	flush := func() {
		if len(evs)+len(outs) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := r.st.AppendAuditEvents(ctx, evs, outs); err != nil {
				r.log.Error("record: write events", "events", len(evs), "outputs", len(outs), "err", err)
				r.dropped.Add(uint64(len(evs) + len(outs)))
			}
			cancel()
		}
		if len(evs) > 0 {
			for _, x := range r.opt.Exporters {
				x.Export(evs)
			}
		}
		evs, outs = evs[:0], outs[:0]
		for _, w := range waiters {
			close(w)
		}
		waiters = waiters[:0]
		if timer != nil {
			timer.Stop()
		}
		due = nil
	}
	for {
		select {
		case it, ok := <-r.q:
			if !ok {
				flush()
				return
			}
			switch {
			case it.ev != nil:
				evs = append(evs, *it.ev)
			case it.out != nil:
				outs = append(outs, *it.out)
			default:
				waiters = append(waiters, it.flush)
				flush()
				continue
			}
			if len(evs)+len(outs) >= batchMax {
				flush()
			} else if due == nil {
				timer = time.NewTimer(r.opt.FlushInterval)
				due = timer.C
			}
		case <-due:
			flush()
		}
	}
}

// prune deletes expired records once at start and every PruneInterval.
func (r *Recorder) prune() {
	defer r.wg.Done()
	t := time.NewTicker(r.opt.PruneInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if n, err := r.st.PruneAudit(ctx, time.Now().Add(-r.opt.Retention)); err != nil {
			r.log.Error("record: prune", "err", err)
		} else if n > 0 {
			r.log.Info("record: pruned expired events", "events", n, "retention", r.opt.Retention)
		}
		cancel()
		select {
		case <-r.stopPrune:
			return
		case <-t.C:
		}
	}
}

// Events returns the events q selects, including everything recorded
// before the call.
func (r *Recorder) Events(ctx context.Context, q store.AuditQuery) ([]protocol.AuditEvent, error) {
	if err := r.Flush(ctx); err != nil {
		return nil, fmt.Errorf("flush record: %w", err)
	}
	return r.st.AuditEvents(ctx, q)
}

// Owner is the workspace sandboxID's record belongs to, "" when there is
// none (never recorded, or pruned).
func (r *Recorder) Owner(ctx context.Context, sandboxID string) (string, error) {
	if err := r.Flush(ctx); err != nil {
		return "", fmt.Errorf("flush record: %w", err)
	}
	_, ws, err := r.st.MaxAuditSeq(ctx, sandboxID)
	return ws, err
}

// Step returns step's events and captured output; no events is an empty
// step (the caller decides whether that is not found).
func (r *Recorder) Step(ctx context.Context, sandboxID string, step int64) (*protocol.AuditStep, error) {
	evs, err := r.Events(ctx, store.AuditQuery{SandboxID: sandboxID, Step: step})
	if err != nil {
		return nil, err
	}
	outs, err := r.st.AuditOutputs(ctx, sandboxID, step)
	if err != nil {
		return nil, err
	}
	st := &protocol.AuditStep{Step: step, Events: evs}
	for _, o := range outs {
		switch o.Stream {
		case streamStdout:
			st.Stdout = wireOutput(o)
		case streamStderr:
			st.Stderr = wireOutput(o)
		}
	}
	return st, nil
}

// follower is one live subscription to a sandbox's new events. Its channel
// is closed when it lags followBuffer events behind (or the Recorder
// closes): the follower then catches up from the store.
type follower struct {
	ch     chan protocol.AuditEvent
	closed bool
}

// sendLocked delivers ev or cuts the follower off. Callers hold mu.
func (f *follower) sendLocked(ev protocol.AuditEvent) {
	if f.closed {
		return
	}
	select {
	case f.ch <- ev:
	default:
		f.closed = true
		close(f.ch)
	}
}

// Follow subscribes to sandboxID's events recorded from now on. The
// channel closes if the follower falls behind, or at EndFollowers (ok is
// then false, as it is for a Follow after it); stop ends the subscription.
func (r *Recorder) Follow(sandboxID string) (events <-chan protocol.AuditEvent, stop func(), ok bool) {
	f := &follower{ch: make(chan protocol.AuditEvent, followBuffer)}
	r.mu.Lock()
	if r.ended {
		r.mu.Unlock()
		close(f.ch)
		return f.ch, func() {}, false
	}
	if r.subs[sandboxID] == nil {
		r.subs[sandboxID] = map[*follower]struct{}{}
	}
	r.subs[sandboxID][f] = struct{}{}
	r.mu.Unlock()
	return f.ch, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.subs[sandboxID], f)
		if len(r.subs[sandboxID]) == 0 {
			delete(r.subs, sandboxID)
		}
	}, true
}

// Following reports whether live follows are still served (EndFollowers
// has not been called).
func (r *Recorder) Following() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.ended
}

// EndFollowers closes every live follow and refuses new ones, so streams
// end when the API shuts down.
func (r *Recorder) EndFollowers() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	for _, fs := range r.subs {
		for f := range fs {
			if !f.closed {
				f.closed = true
				close(f.ch)
			}
		}
	}
}

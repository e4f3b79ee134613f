// Package filerec adds file and package events to sandboxes' audit
// records: after each command (and at stop and capture) what the sandbox
// changed in its filesystem, computed by the daemon from the sandbox's
// upper dir (storage.Tracker), and the packages those changes installed,
// removed or upgraded.
//
// Scans are off the request path: a command's client has its exit before
// the scan starts. Each sandbox has one queue of scans, run in order by
// one goroutine while it is non-empty; a command's start waits (at most
// StartWait) for the sandbox's queued scans, so in the record a step's
// file and package events come before the next command's, and what the
// next command writes is not counted as the last one's. Commands running
// at once in one sandbox share their changes: each scan reports what
// changed since the one before, under the step that ended.
package filerec

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Layers says where a sandbox's files are: its upper dir and the layers
// below it, bottom first (sandbox.Manager implements it).
type Layers interface {
	FileLayers(ctx context.Context, sandboxID string) (upper string, lowers []string, err error)
}

// Recorder is where events go (*record.Recorder).
type Recorder interface {
	Record(ctx context.Context, e record.Event)
}

// Bounds of the watcher.
const (
	// StartWait bounds how long a command's start waits for its
	// sandbox's earlier scans (each commits the btrfs transaction, which a
	// host busy writing can make slow): past it the command runs, and what
	// it writes before the earlier scan lists the upper counts as the
	// earlier step's.
	StartWait = 5 * time.Second
	// MaxListed bounds the paths one file.changed event lists.
	MaxListed = 1000
	// scanTimeout bounds one scan (or the first index of a sandbox).
	scanTimeout = time.Minute
)

var _ record.FileWatcher = (*Watcher)(nil)

// Watcher scans sandboxes' files as their commands end. Safe for
// concurrent use.
type Watcher struct {
	rec    Recorder
	layers Layers
	log    *slog.Logger

	mu     sync.Mutex
	boxes  map[string]*box
	closed bool
	wg     sync.WaitGroup
}

// New returns a Watcher recording into rec. Close it before rec.
func New(rec Recorder, layers Layers, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.Default()
	}
	return &Watcher{rec: rec, layers: layers, log: log, boxes: map[string]*box{}}
}

// Close waits for queued scans and refuses new ones.
func (w *Watcher) Close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}

// box is one sandbox's queue and tracking state. Only its running job
// touches tr and pk.
type box struct {
	id string

	mu      sync.Mutex // guards jobs, running, idle
	jobs    []job
	running bool
	idle    chan struct{} // closed when the queue drains; nil when idle

	stack  []string // lower layers (bottom first), then the upper
	lowers []string
	tr     *storage.Tracker
	pk     *pkgState
	failed bool // indexing failed: no file events
}

type jobKind int

const (
	jobIndex jobKind = iota // index the sandbox's files, if not yet
	jobScan                 // record what changed
	jobDrop                 // forget the index (reset, deleted)
)

type job struct {
	kind jobKind
	ctx  context.Context // detached: the actor of the events
	ws   string
	step int64
	at   string // lifecycle event of a step-0 scan
	gone bool   // jobDrop: the sandbox is deleted
}

// enqueue adds j to sandboxID's queue, starting its goroutine if idle;
// create says whether a sandbox without a box gets one.
func (w *Watcher) enqueue(sandboxID string, j job, create bool) *box {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	b := w.boxes[sandboxID]
	if b == nil {
		if !create {
			return nil
		}
		b = &box{id: sandboxID}
		w.boxes[sandboxID] = b
	}
	b.mu.Lock()
	b.jobs = append(b.jobs, j)
	if !b.running {
		b.running, b.idle = true, make(chan struct{})
		w.wg.Add(1)
		go w.run(b)
	}
	b.mu.Unlock()
	return b
}

// run works through b's queue until it is empty.
func (w *Watcher) run(b *box) {
	defer w.wg.Done()
	for {
		b.mu.Lock()
		if len(b.jobs) == 0 {
			b.running = false
			close(b.idle)
			b.idle = nil
			b.mu.Unlock()
			return
		}
		j := b.jobs[0]
		b.jobs = b.jobs[1:]
		b.mu.Unlock()
		w.do(b, j)
	}
}

// CommandStarting makes sure sandboxID's files are indexed before its
// command runs, and waits (at most StartWait) for its queued scans.
func (w *Watcher) CommandStarting(ctx context.Context, sandboxID string) {
	b := w.enqueue(sandboxID, job{kind: jobIndex, ctx: context.WithoutCancel(ctx)}, true)
	if b == nil {
		return
	}
	b.mu.Lock()
	idle := b.idle
	b.mu.Unlock()
	if idle == nil {
		return
	}
	t := time.NewTimer(StartWait)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
	}
}

// CommandEnded queues the scan of what command step changed.
func (w *Watcher) CommandEnded(ctx context.Context, sandboxID, workspaceID string, step int64) {
	w.enqueue(sandboxID, job{kind: jobScan, ctx: context.WithoutCancel(ctx), ws: workspaceID, step: step}, false)
}

// Lifecycle queues a step-0 scan at stop, capture and a file upload, and
// forgets the index at reset (the upper is emptied) and deletion.
func (w *Watcher) Lifecycle(ctx context.Context, e record.Event) {
	ctx = context.WithoutCancel(ctx)
	switch e.Type {
	case protocol.EventStopped, protocol.EventCaptured:
		if e.Type == protocol.EventStopped && stopReason(e) == "reset" {
			return // the upper is about to be emptied: reset drops the index
		}
		w.enqueue(e.SandboxID, job{kind: jobScan, ctx: ctx, ws: e.WorkspaceID, at: e.Type}, false)
	case protocol.EventFileUploaded:
		// A step-0 scan right away, so what the upload wrote is known (and
		// reported as the upload's), not folded into the next command's
		// changes, where a command deleting it would leave no trace.
		w.enqueue(e.SandboxID, job{kind: jobScan, ctx: ctx, ws: e.WorkspaceID, at: "uploaded"}, false)
	case protocol.EventReset, protocol.EventDeleted:
		w.enqueue(e.SandboxID, job{kind: jobDrop, ctx: ctx, gone: e.Type == protocol.EventDeleted}, false)
	}
}

// stopReason is a stopped event's data.reason.
func stopReason(e record.Event) string {
	var d struct{ Reason string }
	if b, err := json.Marshal(e.Data); err == nil {
		json.Unmarshal(b, &d)
	}
	return d.Reason
}

func (w *Watcher) do(b *box, j job) {
	ctx, cancel := context.WithTimeout(j.ctx, scanTimeout)
	defer cancel()
	switch j.kind {
	case jobIndex:
		if b.tr == nil && !b.failed {
			if err := w.index(ctx, b); err != nil {
				b.failed = true // not retried (nor logged) until a reset
				w.log.Warn("record: index sandbox files; no file events for it", "sandbox", b.id, "err", err)
			}
		}
	case jobScan:
		if b.tr != nil {
			if err := w.scan(ctx, b, j); err != nil {
				w.log.Warn("record: scan sandbox files", "sandbox", b.id, "step", j.step, "err", err)
			}
		}
	case jobDrop:
		b.tr, b.pk, b.failed = nil, nil, false
		if j.gone {
			w.mu.Lock()
			if w.boxes[b.id] == b {
				delete(w.boxes, b.id)
			}
			w.mu.Unlock()
		}
	}
}

// index makes b's Tracker (and reads the package state its upper already
// changed, so the first scan compares against it).
func (w *Watcher) index(ctx context.Context, b *box) error {
	upper, lowers, err := w.layers.FileLayers(ctx, b.id)
	if err != nil {
		return err
	}
	tr, err := storage.NewTracker(ctx, upper, lowers)
	if err != nil {
		return err
	}
	b.tr, b.lowers, b.stack = tr, lowers, append(append([]string(nil), lowers...), upper)
	b.pk = newPkgState()
	if tr.Tracks(dpkgStatus) {
		b.pk.dpkg, err = b.readDpkg(ctx, b.stack)
		if err != nil {
			w.log.Warn("record: read dpkg status", "sandbox", b.id, "err", err)
		}
	}
	return nil
}

// scan records what changed since b's last scan under j's step, and the
// packages that changed with it.
func (w *Watcher) scan(ctx context.Context, b *box, j job) error {
	changes, err := b.tr.Scan(ctx)
	if errors.Is(err, storage.ErrTooManyChanges) {
		// Too many to hold: the step gets an event saying so, without paths.
		w.rec.Record(j.ctx, record.Event{SandboxID: b.id, WorkspaceID: j.ws, Kind: protocol.KindFile,
			Type: protocol.EventFileChanged, Step: j.step, Data: protocol.FileChanges{Truncated: true, Incomplete: true, At: j.at}})
		return nil
	}
	if err != nil || len(changes) == 0 {
		return err
	}
	d := fileData(changes, MaxListed)
	d.Incomplete, d.At = b.tr.Incomplete(), j.at
	w.rec.Record(j.ctx, record.Event{SandboxID: b.id, WorkspaceID: j.ws, Kind: protocol.KindFile,
		Type: protocol.EventFileChanged, Step: j.step, Data: d})
	pkgs, err := b.packages(ctx, changes)
	for _, p := range pkgs {
		w.rec.Record(j.ctx, record.Event{SandboxID: b.id, WorkspaceID: j.ws, Kind: protocol.KindPackage,
			Type: p.typ, Step: j.step, Data: p.PackageChange})
	}
	return err
}

// fileData is the file.changed data of changes, listing at most max paths.
func fileData(changes []storage.FileChange, max int) protocol.FileChanges {
	var d protocol.FileChanges
	listed := 0
	for _, c := range changes {
		room := listed < max
		switch c.Kind {
		case storage.Added:
			d.AddedCount++
			if room {
				d.Added = append(d.Added, protocol.AddedFile{Path: c.Path, Size: c.Size, Mode: c.Mode.String()})
			}
		case storage.Modified:
			d.ModifiedCount++
			if room {
				m := protocol.ModifiedFile{Path: c.Path, Size: c.Size, Mode: c.Mode.String()}
				if c.SizeBefore != c.Size {
					m.SizeBefore = &c.SizeBefore
				}
				if c.ModeBefore != c.Mode {
					m.ModeBefore = c.ModeBefore.String()
				}
				d.Modified = append(d.Modified, m)
			}
		case storage.Deleted:
			d.DeletedCount++
			if room {
				d.Deleted = append(d.Deleted, c.Path)
			}
		}
		if room {
			listed++
		} else {
			d.Truncated = true
		}
	}
	return d
}

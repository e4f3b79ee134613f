// Package accesslog is the access audit's writer: who did what to which
// resource, when, from where, and with what outcome (store.AccessRecord).
//
// Recording never waits on the database: Record puts the record in a
// bounded buffer and returns; one goroutine writes buffered records in
// batches, each within FlushInterval of its first record, and on Close.
// A full buffer drops the record and counts it (Dropped) rather than slow
// the request. A crash (kill -9) loses at most the records of the last
// FlushInterval.
package accesslog

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Recorder takes access records; handlers and services (key and user
// management, share grants, quota changes) call it for events a request
// record alone would not show, with Action set, e.g. "share.grant".
type Recorder interface {
	Record(ctx context.Context, rec store.AccessRecord)
}

// Discard is a Recorder that keeps nothing.
type Discard struct{}

// Record implements Recorder.
func (Discard) Record(context.Context, store.AccessRecord) {}

// Sink is where records end up.
type Sink interface {
	AppendAccess(ctx context.Context, recs []store.AccessRecord) error
}

// Tuning of a Log.
const (
	// FlushInterval bounds how long a record waits in the buffer.
	FlushInterval = 100 * time.Millisecond
	bufferSize    = 8192
	maxBatch      = 512
)

// Log is the buffered Recorder over a Sink.
type Log struct {
	sink    Sink
	log     *slog.Logger
	ch      chan store.AccessRecord
	quit    chan struct{}
	done    chan struct{}
	once    sync.Once
	dropped atomic.Int64
}

var _ Recorder = (*Log)(nil)

// New starts a Log writing to sink; Close it to flush.
func New(sink Sink, log *slog.Logger) *Log {
	l := &Log{sink: sink, log: log, ch: make(chan store.AccessRecord, bufferSize), quit: make(chan struct{}), done: make(chan struct{})}
	go l.run()
	return l
}

// Record buffers rec, filling who (workspace, user, key prefix) from the
// principal in ctx where rec leaves them empty, and the time when zero.
func (l *Log) Record(ctx context.Context, rec store.AccessRecord) {
	Fill(ctx, &rec)
	select {
	case l.ch <- rec:
	default:
		l.dropped.Add(1)
	}
}

// Fill completes rec's who and when from ctx and the clock.
func Fill(ctx context.Context, rec *store.AccessRecord) {
	if p, ok := auth.FromContext(ctx); ok {
		for _, f := range []struct {
			dst *string
			v   string
		}{{&rec.WorkspaceID, p.WorkspaceID}, {&rec.UserID, p.User}, {&rec.KeyPrefix, p.KeyPrefix}} {
			if *f.dst == "" {
				*f.dst = f.v
			}
		}
	}
	if rec.Time.IsZero() {
		rec.Time = time.Now()
	}
}

// Dropped counts records lost to a full buffer or a failed write.
func (l *Log) Dropped() int64 { return l.dropped.Load() }

// Close writes what is buffered and stops the writer. Records after Close
// are dropped.
func (l *Log) Close() {
	l.once.Do(func() { close(l.quit) })
	<-l.done
	if n := l.Dropped(); n > 0 {
		l.log.Warn("access audit records dropped (buffer full or write failed)", "records", n)
	}
}

func (l *Log) run() {
	defer close(l.done)
	batch := make([]store.AccessRecord, 0, maxBatch)
	for {
		select {
		case rec := <-l.ch:
			batch = append(batch[:0], rec)
		case <-l.quit:
			l.drain(batch[:0])
			return
		}
		timer := time.NewTimer(FlushInterval)
	collect:
		for len(batch) < maxBatch {
			select {
			case rec := <-l.ch:
				batch = append(batch, rec)
			case <-timer.C:
				break collect
			case <-l.quit:
				break collect
			}
		}
		timer.Stop()
		l.write(batch)
	}
}

// drain writes everything still buffered, in batches.
func (l *Log) drain(batch []store.AccessRecord) {
	for {
		select {
		case rec := <-l.ch:
			if batch = append(batch, rec); len(batch) == maxBatch {
				l.write(batch)
				batch = batch[:0]
			}
		default:
			l.write(batch)
			return
		}
	}
}

func (l *Log) write(batch []store.AccessRecord) {
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.sink.AppendAccess(ctx, batch); err != nil {
		l.dropped.Add(int64(len(batch)))
		l.log.Error("write access audit records", "records", len(batch), "err", err)
	}
}

// Quotas records quota changes through a Recorder (api.QuotaAudit): one
// "quota.set" record in the workspace whose quotas changed, so its admins
// see who changed them.
type Quotas struct{ Recorder Recorder }

// QuotaChanged implements api.QuotaAudit.
func (q Quotas) QuotaChanged(ctx context.Context, p auth.Principal, workspaceID string, _ protocol.Quota) {
	q.Recorder.Record(auth.WithPrincipal(ctx, p), store.AccessRecord{WorkspaceID: workspaceID, Action: "quota.set",
		ResourceKind: "workspace", Resource: workspaceID})
}

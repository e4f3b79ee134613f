package accesslog

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// memSink keeps what it is given; block, when set, holds every write
// until it is closed.
type memSink struct {
	mu      sync.Mutex
	recs    []store.AccessRecord
	batches int
	block   chan struct{}
}

func (m *memSink) AppendAccess(_ context.Context, recs []store.AccessRecord) error {
	if m.block != nil {
		<-m.block
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs = append(m.recs, recs...)
	m.batches++
	return nil
}

func (m *memSink) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.recs)
}

func TestRecordFillsAndFlushes(t *testing.T) {
	sink := &memSink{}
	l := New(sink, slog.New(slog.DiscardHandler))
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{WorkspaceID: "w", User: "bob", KeyPrefix: "cbk_12345678"})
	start := time.Now()
	for range 3 {
		l.Record(ctx, store.AccessRecord{Action: "key.create", Resource: "k1"})
	}
	for sink.len() < 3 {
		if time.Since(start) > 2*FlushInterval+time.Second {
			t.Fatalf("records not written within the flush interval: %d of 3", sink.len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.Close()
	r := sink.recs[0]
	if r.WorkspaceID != "w" || r.UserID != "bob" || r.KeyPrefix != "cbk_12345678" || r.Time.Before(start) || r.Action != "key.create" {
		t.Fatalf("record %+v", r)
	}
	if sink.batches != 1 {
		t.Errorf("3 records in %d batches, want 1", sink.batches)
	}
}

func TestCloseFlushesAndFullBufferDrops(t *testing.T) {
	sink := &memSink{block: make(chan struct{})}
	l := New(sink, slog.New(slog.DiscardHandler))
	n := bufferSize + 2*maxBatch + 100
	for range n {
		l.Record(context.Background(), store.AccessRecord{Method: "GET"})
	}
	if l.Dropped() == 0 {
		t.Fatal("a full buffer dropped nothing")
	}
	close(sink.block)
	l.Close()
	if got := int64(sink.len()) + l.Dropped(); got != int64(n) {
		t.Fatalf("written %d + dropped %d = %d, want %d", sink.len(), l.Dropped(), got, n)
	}
	if sink.len() < bufferSize {
		t.Fatalf("Close left buffered records unwritten: %d written", sink.len())
	}
}

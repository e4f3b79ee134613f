package record

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// countingStore is the SQLite store counting the batches written to it.
type countingStore struct {
	*store.SQLite
	mu      sync.Mutex
	batches []int
}

func (s *countingStore) AppendAuditEvents(ctx context.Context, evs []protocol.AuditEvent, outs []store.AuditOutput) error {
	s.mu.Lock()
	s.batches = append(s.batches, len(evs)+len(outs))
	s.mu.Unlock()
	return s.SQLite.AppendAuditEvents(ctx, evs, outs)
}

func (s *countingStore) writes() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]int(nil), s.batches...)
}

func openStore(t *testing.T) (*countingStore, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "c.db")
	st, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &countingStore{SQLite: st}, path
}

func newRecorder(t *testing.T, st Store, opt Options) *Recorder {
	t.Helper()
	r := New(st, opt)
	t.Cleanup(r.Close)
	return r
}

func lifecycle(sb, typ string) Event {
	return Event{SandboxID: sb, WorkspaceID: "w", Kind: protocol.KindLifecycle, Type: typ}
}

func events(t *testing.T, r *Recorder, q store.AuditQuery) []protocol.AuditEvent {
	t.Helper()
	evs, err := r.Events(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestSeqMonotonicUnderConcurrency records from many goroutines and checks
// each sandbox's seqs are 1..n with no gap or repeat, and the actor is the
// principal in the context (system without one).
func TestSeqMonotonicUnderConcurrency(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{WorkspaceID: "w", User: "alice", KeyPrefix: "cub_ab12"})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				r.Record(ctx, lifecycle([]string{"a", "b"}[g%2], protocol.EventStarted))
			}
		}()
	}
	wg.Wait()
	r.Record(context.Background(), lifecycle("a", protocol.EventStopped))
	for _, sb := range []string{"a", "b"} {
		evs := events(t, r, store.AuditQuery{SandboxID: sb})
		want := 200
		if sb == "a" {
			want++
		}
		if len(evs) != want {
			t.Fatalf("%s: %d events, want %d", sb, len(evs), want)
		}
		for i, e := range evs {
			if e.Seq != int64(i+1) {
				t.Fatalf("%s: event %d has seq %d", sb, i, e.Seq)
			}
		}
		if a := evs[0].Actor; a.User != "alice" || a.KeyPrefix != "cub_ab12" {
			t.Fatalf("actor = %+v", a)
		}
	}
	if a := events(t, r, store.AuditQuery{SandboxID: "a", SinceSeq: 200})[0].Actor; a.User != protocol.ActorSystem {
		t.Fatalf("reaper's actor = %+v, want system", a)
	}
}

// TestBatchedFlushAndClose checks events reach the store within the flush
// interval without any read forcing them, in one batch, and that Close
// writes what is still queued (a graceful stop loses nothing) so a new
// Recorder continues the seqs.
func TestBatchedFlushAndClose(t *testing.T) {
	st, _ := openStore(t)
	r := New(st, Options{FlushInterval: 50 * time.Millisecond})
	for range 10 {
		r.Record(context.Background(), lifecycle("a", protocol.EventStarted))
	}
	deadline := time.Now().Add(2 * time.Second)
	for len(st.writes()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if w := st.writes(); len(w) != 1 || w[0] != 10 {
		t.Fatalf("batches = %v, want one of 10", w)
	}
	r.Record(context.Background(), lifecycle("a", protocol.EventStopped))
	r.Close()
	got, err := st.AuditEvents(context.Background(), store.AuditQuery{SandboxID: "a"})
	if err != nil || len(got) != 11 {
		t.Fatalf("after Close: %d events, %v; want 11", len(got), err)
	}
	r2 := newRecorder(t, st, Options{})
	r2.Record(context.Background(), lifecycle("a", protocol.EventStarted))
	if evs := events(t, r2, store.AuditQuery{SandboxID: "a", SinceSeq: 11}); len(evs) != 1 || evs[0].Seq != 12 {
		t.Fatalf("after restart: %+v, want seq 12", evs)
	}
}

// TestQueueFullDrops checks a full queue drops (and counts) events instead
// of blocking the caller.
func TestQueueFullDrops(t *testing.T) {
	st, _ := openStore(t)
	block := make(chan struct{})
	r := newRecorder(t, &blockingStore{countingStore: st, block: block}, Options{Buffer: 4})
	done := make(chan struct{})
	go func() {
		for range 100 {
			r.Record(context.Background(), lifecycle("a", protocol.EventStarted))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Record blocked on a full queue")
	}
	close(block)
	if r.Dropped() == 0 {
		t.Fatal("no drops counted")
	}
}

// blockingStore holds writes until block closes.
type blockingStore struct {
	*countingStore
	block chan struct{}
}

func (s *blockingStore) AppendAuditEvents(ctx context.Context, evs []protocol.AuditEvent, outs []store.AuditOutput) error {
	<-s.block
	return s.countingStore.AppendAuditEvents(ctx, evs, outs)
}

// TestRetentionPrune checks events older than the retention go and newer
// ones stay.
func TestRetentionPrune(t *testing.T) {
	st, _ := openStore(t)
	ctx := context.Background()
	old := protocol.AuditEvent{SandboxID: "a", Seq: 1, Time: time.Now().Add(-48 * time.Hour), WorkspaceID: "w",
		Actor: protocol.Actor{User: "system"}, Kind: protocol.KindLifecycle, Type: protocol.EventCreated}
	if err := st.SQLite.AppendAuditEvents(ctx, []protocol.AuditEvent{old}, []store.AuditOutput{{SandboxID: "a", Step: 1, Stream: "stdout", Time: old.Time}}); err != nil {
		t.Fatal(err)
	}
	r := newRecorder(t, st, Options{Retention: 24 * time.Hour, PruneInterval: 20 * time.Millisecond})
	r.Record(ctx, lifecycle("a", protocol.EventStarted))
	deadline := time.Now().Add(2 * time.Second)
	for {
		evs := events(t, r, store.AuditQuery{SandboxID: "a"})
		if len(evs) == 1 && evs[0].Seq == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("events after prune: %+v", evs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if outs, _ := st.AuditOutputs(ctx, "a", 1); len(outs) != 0 {
		t.Fatalf("expired output kept: %+v", outs)
	}
}

// TestCaptureHeadAndTail checks a stream over the cap keeps its first and
// last halves, marks truncation and counts every byte; replays (reconnects
// from an earlier offset) are not counted twice.
func TestCaptureHeadAndTail(t *testing.T) {
	c := newCapture(8)
	c.writeAt(0, []byte("abc"))
	c.writeAt(0, []byte("abcdef")) // replay overlapping what was seen
	if string(c.head) != "abcd" || string(c.tailBytes()) != "ef" || c.truncated() || c.total != 6 {
		t.Fatalf("head %q tail %q total %d", c.head, c.tailBytes(), c.total)
	}
	c.writeAt(6, []byte("ghij"))
	c.writeAt(10, []byte("klmnopq"))
	if string(c.head) != "abcd" || string(c.tailBytes()) != "nopq" || !c.truncated() || c.total != 17 {
		t.Fatalf("head %q tail %q total %d", c.head, c.tailBytes(), c.total)
	}
	big := bytes.Repeat([]byte("x"), 100)
	c.writeAt(17, append(big, "END!"...))
	if string(c.tailBytes()) != "END!" || c.total != 121 {
		t.Fatalf("tail %q total %d", c.tailBytes(), c.total)
	}
}

// TestCommandStep runs a command's life through the Recorder: its events
// share a step (the seq of its start), env is keys only, and the step read
// back has its output, head and tail.
func TestCommandStep(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{OutputCap: 16})
	ctx := context.Background()
	r.Record(ctx, lifecycle("a", protocol.EventCreated))
	c := r.StartCommand(ctx, CommandStart{SandboxID: "a", WorkspaceID: "w", CommandID: "c1", Command: "make",
		EnvKeys: EnvKeys(map[string]string{"TOKEN": "s3cret", "A": "1"}), Via: "ws"})
	if c.Step() != 2 {
		t.Fatalf("step = %d, want 2", c.Step())
	}
	c.Output(Stdout, 0, []byte("0123456789"))
	c.Output(Stdout, 10, []byte("abcdefghij"))
	c.Output(Stderr, -1, []byte("warn"))
	if got := r.OpenCommand("a", "c1"); got != c {
		t.Fatal("open command not found for reconnect")
	}
	c.Reconnected(ctx)
	c.Killed(ctx, KillRequested)
	c.Killed(ctx, KillTimeout)
	code := 137
	c.Exited(ctx, &code, "")
	c.Exited(ctx, nil, "again")
	if r.OpenCommand("a", "c1") != nil {
		t.Fatal("exited command still open")
	}
	step, err := r.Step(ctx, "a", 2)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range step.Events {
		if e.Step != 2 {
			t.Fatalf("event %+v not in step 2", e)
		}
		types = append(types, e.Type)
	}
	if want := "command.started command.reconnected command.killed command.exited"; strings.Join(types, " ") != want {
		t.Fatalf("types = %v, want %s", types, want)
	}
	var ex exitedData
	if err := json.Unmarshal(step.Events[3].Data, &ex); err != nil || ex.ExitCode == nil || *ex.ExitCode != 137 ||
		ex.StdoutBytes != 20 || ex.StderrBytes != 4 || ex.Killed != KillRequested {
		t.Fatalf("exited = %+v (%v)", ex, err)
	}
	if o := step.Stdout; o == nil || o.Head != "01234567" || o.Tail != "cdefghij" || !o.Truncated || o.TotalBytes != 20 {
		t.Fatalf("stdout = %+v", o)
	}
	if o := step.Stderr; o == nil || o.Head != "warn" || o.Truncated {
		t.Fatalf("stderr = %+v", o)
	}
	all, _ := json.Marshal(step)
	if bytes.Contains(all, []byte("s3cret")) || !bytes.Contains(all, []byte(`"env_keys":["A","TOKEN"]`)) {
		t.Fatalf("step JSON: %s", all)
	}
}

// TestStopEndsOpenCommands checks a sandbox stopping ends its open
// commands (as lost) before the stopped event.
func TestStopEndsOpenCommands(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ctx := context.Background()
	r.StartCommand(ctx, CommandStart{SandboxID: "a", CommandID: "c1", Command: "sleep 100"})
	r.Record(ctx, lifecycle("a", protocol.EventStopped))
	evs := events(t, r, store.AuditQuery{SandboxID: "a"})
	if len(evs) != 3 || evs[1].Type != protocol.EventCommandExited || evs[2].Type != protocol.EventStopped ||
		!bytes.Contains(evs[1].Data, []byte(`"lost":"sandbox stopped"`)) {
		t.Fatalf("events = %+v", evs)
	}
}

// TestFollow checks a follower gets new events live and is cut off (its
// channel closed) when it lags.
func TestFollow(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ctx := context.Background()
	ch, stop, _ := r.Follow("a")
	defer stop()
	r.Record(ctx, lifecycle("b", protocol.EventStarted))
	r.Record(ctx, lifecycle("a", protocol.EventStarted))
	select {
	case e := <-ch:
		if e.SandboxID != "a" || e.Seq != 1 {
			t.Fatalf("followed %+v", e)
		}
	case <-time.After(time.Second):
		t.Fatal("no live event")
	}
	for range followBuffer + 1 {
		r.Record(ctx, lifecycle("a", protocol.EventStarted))
	}
	n := 0
	for range ch {
		n++
	}
	if n != followBuffer {
		t.Fatalf("lagging follower got %d events before being cut off, want %d", n, followBuffer)
	}
}

// TestEndFollowers checks shutting follows down closes live ones and
// refuses new ones, so an API shutdown is not held by open streams.
func TestEndFollowers(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ch, stop, ok := r.Follow("a")
	defer stop()
	if !ok || !r.Following() {
		t.Fatal("follow refused before EndFollowers")
	}
	r.EndFollowers()
	if _, open := <-ch; open {
		t.Fatal("live follow not closed")
	}
	if _, _, ok := r.Follow("a"); ok || r.Following() {
		t.Fatal("follow accepted after EndFollowers")
	}
}

// TestSessionStorageBound checks a 1,000-command session costs at most
// 5 MiB of database besides its output (the bound).
func TestSessionStorageBound(t *testing.T) {
	st, path := openStore(t)
	r := New(st, Options{})
	ctx := auth.WithPrincipal(context.Background(), auth.Principal{WorkspaceID: "w", User: "agent-user", KeyPrefix: "cub_0123"})
	code := 0
	for i := range 1000 {
		c := r.StartCommand(ctx, CommandStart{SandboxID: "3f0b6a8e-2c1d-4c8e-9a51-5f7d2b1e9c40", WorkspaceID: "w",
			CommandID: fmt.Sprintf("0193a7f2-7c1e-7b3a-9e51-%012d", i),
			Command:   "python -m pytest tests/test_module.py -k case_" + strings.Repeat("x", i%20), Shell: "/bin/bash",
			User: "app", Cwd: "/work/project", EnvKeys: []string{"HOME", "PATH", "TOKEN"}, TimeoutSeconds: 60, Via: "ws"})
		c.Output(Stdout, 0, []byte("ok\n"))
		c.Exited(ctx, &code, "")
	}
	r.Close()
	var size int64
	for _, f := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(f); err == nil {
			size += fi.Size()
		}
	}
	if size > 5<<20 {
		t.Fatalf("1,000 commands take %d bytes", size)
	}
	t.Logf("1,000 commands: %d KiB of database (with their 3-byte outputs)", size>>10)
}

// TestOpenCommandsBounded checks the Recorder follows at most
// maxOpenCommands commands, ending the oldest as lost.
func TestOpenCommandsBounded(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ctx := context.Background()
	first := r.StartCommand(ctx, CommandStart{SandboxID: "a", CommandID: "first"})
	for i := range maxOpenCommands {
		r.StartCommand(ctx, CommandStart{SandboxID: "a", CommandID: fmt.Sprint(i)})
	}
	if r.OpenCommand("a", "first") != nil || r.OpenCommand("a", "0") == nil {
		t.Fatal("the oldest open command was not the one evicted")
	}
	evs := events(t, r, store.AuditQuery{SandboxID: "a", Step: first.Step()})
	if len(evs) != 2 || !bytes.Contains(evs[1].Data, []byte(`"lost":"too many open commands`)) {
		t.Fatalf("evicted command's events: %+v", evs)
	}
}

// hookLog is a FileWatcher writing down its calls.
type hookLog struct{ calls []string }

func (h *hookLog) note(s string) { h.calls = append(h.calls, s) }

func (h *hookLog) CommandStarting(_ context.Context, sb string) { h.note("starting " + sb) }
func (h *hookLog) CommandEnded(_ context.Context, sb, ws string, step int64) {
	h.note(fmt.Sprintf("ended %s %s %d", sb, ws, step))
}
func (h *hookLog) Lifecycle(_ context.Context, e Event) { h.note("lifecycle " + e.Type) }

// TestFileWatcherHooks checks a watcher hears of a command before it is
// sent, after its end (with its step), and of lifecycle events, stopping
// ending open commands first.
func TestFileWatcherHooks(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	h := &hookLog{}
	r.WatchFiles(h)
	ctx := context.Background()
	r.Record(ctx, lifecycle("a", protocol.EventCreated))
	r.BeforeCommand(ctx, "a")
	c := r.StartCommand(ctx, CommandStart{SandboxID: "a", WorkspaceID: "w", CommandID: "c1", Command: "true"})
	code := 0
	c.Exited(ctx, &code, "")
	r.BeforeCommand(ctx, "a")
	r.StartCommand(ctx, CommandStart{SandboxID: "a", WorkspaceID: "w", CommandID: "c2", Command: "sleep 9"})
	r.Record(ctx, lifecycle("a", protocol.EventStopped))
	want := []string{"lifecycle created", "starting a", "ended a w 2", "starting a", "ended a w 4", "lifecycle stopped"}
	if !reflect.DeepEqual(h.calls, want) {
		t.Fatalf("hooks:\n got %q\nwant %q", h.calls, want)
	}
}

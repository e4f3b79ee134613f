package record

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestNetworkStepAttribution checks network events take the step of the
// sandbox's only command running when they began (with or without a
// command id), and step 0 when none or several ran.
func TestNetworkStepAttribution(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ctx := context.Background()
	var at time.Time // zero: now
	net := func(host string) {
		r.Network(ctx, "a", "w", protocol.EventNetworkHTTP, at, map[string]any{"host": host})
	}
	net("idle")
	c1 := r.StartCommand(ctx, CommandStart{SandboxID: "a", WorkspaceID: "w", Command: "curl one"}) // no id (HTTP execute)
	r.StartCommand(ctx, CommandStart{SandboxID: "b", WorkspaceID: "w", CommandID: "x", Command: "other sandbox"})
	net("one")
	during := time.Now()
	c2 := r.StartCommand(ctx, CommandStart{SandboxID: "a", WorkspaceID: "w", CommandID: "c2", Command: "curl two"})
	net("both")
	c1.Exited(ctx, new(int), "")
	net("two")
	c2.Exited(ctx, new(int), "")
	net("after")
	// A connection recorded when it closes, after its command ended,
	// belongs to the command running when it began.
	at = during
	net("late")
	want := map[string]int64{"idle": 0, "one": c1.Step(), "both": 0, "two": c2.Step(), "after": 0, "late": c1.Step()}
	evs := events(t, r, store.AuditQuery{SandboxID: "a", Kinds: []string{protocol.KindNetwork}})
	if len(evs) != len(want) {
		t.Fatalf("network events = %+v", evs)
	}
	for _, ev := range evs {
		var d struct{ Host string }
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		if ev.Step != want[d.Host] || ev.Kind != protocol.KindNetwork || ev.Type != protocol.EventNetworkHTTP {
			t.Fatalf("event %s: step %d kind %s, want step %d", d.Host, ev.Step, ev.Kind, want[d.Host])
		}
	}
}

// TestNetworkRateBound checks a burst past NetBurst is cut, and the next
// event after the bucket refills reports how many were dropped.
func TestNetworkRateBound(t *testing.T) {
	st, _ := openStore(t)
	r := newRecorder(t, st, Options{})
	ctx := context.Background()
	for range NetBurst + 50 {
		r.Network(ctx, "a", "w", protocol.EventNetworkFlow, time.Time{}, map[string]any{})
	}
	// Other sandboxes have their own budget.
	r.Network(ctx, "b", "w", protocol.EventNetworkFlow, time.Time{}, map[string]any{})
	if n := len(events(t, r, store.AuditQuery{SandboxID: "b"})); n != 1 {
		t.Fatalf("sandbox b has %d events", n)
	}
	time.Sleep(2 * time.Second / NetRate) // a token or two
	r.Network(ctx, "a", "w", protocol.EventNetworkFlow, time.Time{}, map[string]any{"last": true})
	evs := events(t, r, store.AuditQuery{SandboxID: "a", Limit: 5000})
	var d struct {
		Last          bool  `json:"last"`
		DroppedBefore int64 `json:"dropped_before"`
	}
	if err := json.Unmarshal(evs[len(evs)-1].Data, &d); err != nil || !d.Last {
		t.Fatalf("last event %s (%v)", evs[len(evs)-1].Data, err)
	}
	// The bucket refills while the burst is recorded: a few more may be
	// kept than NetBurst, but every event is kept or counted.
	if kept := int64(len(evs) - 1); kept+d.DroppedBefore != NetBurst+50 || d.DroppedBefore < 40 {
		t.Fatalf("kept %d, dropped_before %d: want %d in all, most of 50 dropped", kept, d.DroppedBefore, NetBurst+50)
	}
}

// exportSink is an Exporter keeping what it is given.
type exportSink struct {
	mu     sync.Mutex
	seqs   []int64
	closed bool
}

func (s *exportSink) Export(evs []protocol.AuditEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range evs {
		s.seqs = append(s.seqs, e.Seq)
	}
}

func (s *exportSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// TestExportersSeeEveryEventInOrder checks exporters get each written
// event once, in seq order, and are closed with the Recorder.
func TestExportersSeeEveryEventInOrder(t *testing.T) {
	st, _ := openStore(t)
	sink := &exportSink{}
	r := New(st, Options{Exporters: []Exporter{sink}})
	ctx := context.Background()
	r.Record(ctx, lifecycle("a", protocol.EventCreated))
	for range 600 { // more than one batch
		r.Network(ctx, "a", "w", protocol.EventNetworkDNS, time.Time{}, map[string]any{})
	}
	r.Close()
	if !sink.closed || len(sink.seqs) != 601 {
		t.Fatalf("closed %v, %d events exported", sink.closed, len(sink.seqs))
	}
	for i, s := range sink.seqs {
		if s != int64(i+1) {
			t.Fatalf("export %d has seq %d", i, s)
		}
	}
}

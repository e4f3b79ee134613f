package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestStatsMeasuresRunningSandboxes(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, member, "box")
	st, err := e.m.Stats(as(member), "box")
	if err != nil {
		t.Fatal(err)
	}
	want := protocol.SandboxStats{ID: sb.ID, Name: "box", Status: protocol.StatusReady, Runtime: "fake", SampledAt: st.SampledAt,
		VCPUs: sb.VCPUs, CPUSeconds: sandboxtest.FakeCPUSeconds, MemoryBytes: sandboxtest.FakeMemoryBytes, MemoryLimitBytes: sb.MemBytes,
		DiskBytes: 1, DiskLimitBytes: sb.FSCapacityBytes, NetRxBytes: sandboxtest.FakeRxBytes, NetTxBytes: sandboxtest.FakeTxBytes}
	if *st != want {
		t.Fatalf("Stats = %+v\nwant    %+v", *st, want)
	}
	if _, err := e.m.Stats(as(other), "box"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another member's Stats: %v, want not found", err)
	}
	if _, err := e.m.StopSandbox(as(member), "box"); err != nil {
		t.Fatal(err)
	}
	list, err := e.m.ListStats(as(member))
	if err != nil || len(list) != 1 {
		t.Fatalf("ListStats = %+v, %v", list, err)
	}
	if got := list[0]; got.Status != protocol.StatusStopped || got.CPUSeconds != 0 || got.DiskBytes != -1 {
		t.Fatalf("stopped sandbox's stats = %+v, want no usage", got)
	}
	if list, _ := e.m.ListStats(as(other)); len(list) != 0 {
		t.Fatalf("ListStats of another member = %+v, want none", list)
	}
	all, err := e.m.Census(context.Background())
	if err != nil || len(all) != 1 || all[0].ID != sb.ID {
		t.Fatalf("Census = %+v, %v", all, err)
	}
}

// recorder is an Observer that records what it sees.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(s string) { r.mu.Lock(); r.events = append(r.events, s); r.mu.Unlock() }

func (r *recorder) Begin(ctx context.Context, op, id string) (context.Context, func(error)) {
	r.add("begin " + op)
	return ctx, func(err error) { r.add("end " + op) }
}

func (r *recorder) Phase(_ context.Context, op, phase string, start, end time.Time) {
	if end.Before(start) {
		r.add("bad phase " + phase)
	}
	r.add(op + " " + phase)
}

func TestObserverSeesOperationsAndBootPhases(t *testing.T) {
	rec := &recorder{}
	e := newEnv(t, func(c *Config) { c.Observer = rec })
	e.create(t, admin, "box")
	if _, err := e.m.StopSandbox(as(admin), "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(as(admin), "box"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.CaptureSnapshot(as(admin), "box", protocol.CaptureSnapshotRequest{Name: "cap"}); err != nil {
		t.Fatal(err)
	}
	want := []string{"begin create", "create queue", "create rootfs", "create network", "create egress", "create driver", "create agent", "end create",
		"begin stop", "end stop",
		"begin start", "start queue", "start rootfs", "start network", "start egress", "start driver", "start agent", "end start",
		"begin capture", "end capture"}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !slices.Equal(rec.events, want) {
		t.Fatalf("observed\n%q\nwant\n%q", rec.events, want)
	}
}

package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// memCounterLoop counts in /tmp/c every 100 ms, detached from the exec
// that starts it, so it lives only in the sandbox's memory (gVisor's /tmp
// is its own tmpfs) and in its process table. Each value is renamed into
// place, so a reader never sees the file empty.
const memCounterLoop = `setsid sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`

func memCounter(t testing.TB, c *cubicle.Client, name string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(mustRun(t, c, name, "cat /tmp/c")))
	if err != nil {
		t.Fatalf("counter in %s: %v", name, err)
	}
	return n
}

// wantCounting checks that sandbox name's counter is at least from and
// still increasing.
func wantCounting(t testing.TB, c *cubicle.Client, name string, from int) {
	t.Helper()
	first := memCounter(t, c, name)
	time.Sleep(400 * time.Millisecond)
	second := memCounter(t, c, name)
	if first < from || second <= first {
		t.Fatalf("%s: counter %d then %d, want ≥ %d and increasing", name, first, second, from)
	}
	t.Logf("%s: counter %d then %d (captured at ≥ %d)", name, first, second, from)
}

// TestMemorySnapshot: on gvisor, a capture with include_memory saves the
// running processes, and sandboxes created from it, or forked with
// include_memory, resume them (a counter goes on from where it was) on
// their own address with a working agent; the source keeps running; a
// restored sandbox restarts cold; deleting the snapshot deletes its memory
// image. The namespace runtime answers 422.
func TestMemorySnapshot(t *testing.T) {
	ref := testImage(t)
	ctx := context.Background()
	t.Run("namespace", func(t *testing.T) {
		d := startDaemon(t, "namespace", "")
		c := d.Client
		base := readySnapshot(t, c, "base", ref)
		p := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "p" })
		_, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "mem", IncludeMemory: true})
		wantStatus(t, err, http.StatusUnprocessableEntity)
		var ae *cubicle.APIError
		if errors.As(err, &ae) && !strings.Contains(ae.Error(), "namespace runtime") {
			t.Errorf("unclear 422: %v", err)
		}
		_, err = c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 1, IncludeMemory: true})
		wantStatus(t, err, http.StatusUnprocessableEntity)
		_, err = c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "ckpt", Checkpoint: true})
		wantStatus(t, err, http.StatusUnprocessableEntity)
	})
	t.Run("gvisor", func(t *testing.T) {
		d := startDaemon(t, "gvisor", "")
		c := d.Client
		base := readySnapshot(t, c, "base", ref)
		p := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "parent" })
		mustRun(t, c, p.Name, "echo on-disk > /root/f && "+memCounterLoop)
		time.Sleep(time.Second)
		atCapture := memCounter(t, c, p.Name)
		t0 := time.Now()
		sn, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "mem", IncludeMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("capture with memory: %v", time.Since(t0))
		memDir := filepath.Join(d.dataDir, "cow", "snapshots", sn.ID+".mem")
		if _, err := os.Stat(memDir); err != nil {
			t.Fatalf("memory image: %v", err)
		}
		wantCounting(t, c, p.Name, atCapture)

		t0 = time.Now()
		r := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "restored" })
		t.Logf("create from memory snapshot: %v", time.Since(t0))
		wantCounting(t, c, r.Name, atCapture)
		// Its memory is the parent's, its hostname its own (and /etc/hosts
		// with it): the agent sets it before the create answers.
		if got := mustRun(t, c, r.Name, "cat /root/f; hostname; grep -c restored /etc/hosts"); got != "on-disk\nrestored\n1\n" {
			t.Fatalf("restored sandbox sees %q (want the parent's file, its own hostname and hosts line)", got)
		}
		// Branches diverge: a file written in one is not in the other.
		mustRun(t, c, r.Name, "echo restored > /root/f")
		if got := mustRun(t, c, p.Name, "cat /root/f"); got != "on-disk\n" {
			t.Fatalf("parent sees %q after the restored sandbox wrote", got)
		}

		// Fork with memory: every branch resumes the counter.
		forkAt := memCounter(t, c, p.Name)
		t0 = time.Now()
		fork, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 2, Names: []string{"m0", "m1"}, IncludeMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("memory fork into 2: %v", time.Since(t0))
		ids := map[string]string{"parent": strings.TrimSpace(mustRun(t, c, p.Name, "cat /etc/machine-id 2>/dev/null; true"))}
		for _, b := range fork.Sandboxes {
			wantCounting(t, c, b.Name, forkAt)
			if got := mustRun(t, c, b.Name, "hostname"); got != b.Name+"\n" {
				t.Fatalf("branch %s has hostname %q", b.Name, got)
			}
			id := strings.TrimSpace(mustRun(t, c, b.Name, "cat /etc/machine-id"))
			for who, other := range ids {
				if id == "" || id == other {
					t.Fatalf("branch %s machine-id %q is not its own (same as %s)", b.Name, id, who)
				}
			}
			ids[b.Name] = id
		}
		wantCounting(t, c, p.Name, forkAt)

		// A restored sandbox restarts cold from its files: the counter is
		// gone, the files stay.
		if err := c.StopSandbox(ctx, r.Name); err != nil {
			t.Fatal(err)
		}
		if err := c.StartSandbox(ctx, r.Name); err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, c, r.Name, "cat /root/f; test -e /tmp/c && echo counter-survived; true"); got != "restored\n" {
			t.Fatalf("restarted restored sandbox sees %q", got)
		}

		// The snapshot's memory image goes with it.
		for _, name := range []string{r.Name, "m0", "m1"} {
			if err := c.DeleteSandbox(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{sn.ID, fork.SnapshotID} {
			if err := c.DeleteSnapshot(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := os.Stat(memDir); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("memory image of a deleted snapshot: %v", err)
		}
		// A stopped sandbox has no memory to capture.
		if err := c.StopSandbox(ctx, p.Name); err != nil {
			t.Fatal(err)
		}
		_, err = c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "stopped", IncludeMemory: true})
		wantStatus(t, err, http.StatusUnprocessableEntity)
	})
}

// BenchmarkMemFork measures a memory fork into one branch on gvisor: the
// time from the request until the branch, restored from the parent's
// memory, is ready (capture with checkpoint + restore + agent answering).
//
//	go test -run '^$' -bench MemFork -benchtime 5x ./test/e2e/
func BenchmarkMemFork(b *testing.B) {
	ref := testImage(b)
	ctx := context.Background()
	d := startDaemon(b, "gvisor", "")
	c := d.Client
	base := readySnapshot(b, c, "base", ref)
	p := newSandbox(b, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "parent" })
	mustRun(b, c, p.Name, memCounterLoop)
	time.Sleep(500 * time.Millisecond)
	var times, capts []float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		at := memCounter(b, c, p.Name)
		t0 := time.Now()
		res, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 1, IncludeMemory: true})
		times = append(times, ms(time.Since(t0)))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		wantCounting(b, c, res.Sandboxes[0].Name, at)
		if err := c.DeleteSandbox(ctx, res.Sandboxes[0].Name); err != nil {
			b.Fatal(err)
		}
		if err := c.DeleteSnapshot(ctx, res.SnapshotID); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		sn, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "cap", IncludeMemory: true})
		capts = append(capts, ms(time.Since(t1)))
		if err != nil {
			b.Fatal(err)
		}
		if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	sort.Float64s(times)
	b.Logf("memory fork (ms, sorted): %v; capture with memory: %v", times, capts)
	b.ReportMetric(median(times), "ms-p50")
	b.ReportMetric(median(capts), "capture-ms-p50")
}

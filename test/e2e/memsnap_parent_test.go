package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// wantParentReady fails unless sandbox name is still ready (not stopped by
// the daemon's exit watcher) and the daemon never logged it dying.
func wantParentReady(t testing.TB, d *daemon, name string) {
	t.Helper()
	sb, err := d.Client.GetSandbox(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if sb.Status != protocol.StatusReady {
		t.Fatalf("%s is %s (%s)", name, sb.Status, sb.StatusMessage)
	}
	if strings.Contains(d.logs.String(), "sandbox died") {
		t.Fatalf("the daemon saw a sandbox die:\n%s", d.logs.String())
	}
}

// deleteFork deletes a fork's branches and its snapshot.
func deleteFork(t testing.TB, c *cubicle.Client, res *protocol.ForkResponse) {
	t.Helper()
	ctx := context.Background()
	for _, sb := range res.Sandboxes {
		if err := c.DeleteSandbox(ctx, sb.Name); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(ctx, res.SnapshotID); err != nil {
		t.Fatal(err)
	}
}

// TestMemoryForkAfterBranches is the benchmark sequence that used to stop
// its parent ("sandbox exited unexpectedly" right after the capture): a
// sandbox holding 200 MB of files is forked into 1, then 10 branches, then
// forked with memory. The parent stays ready and its counter goes on.
func TestMemoryForkAfterBranches(t *testing.T) {
	ctx := context.Background()
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	base := readySnapshot(t, c, "base", testImage(t))
	p := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "big" })
	mustRun(t, c, p.Name, "mkdir -p /data && for i in 0 1 2 3 4 5 6 7 8 9; do dd if=/dev/urandom of=/data/blob$i bs=1M count=20 2>/dev/null; done")
	mustRun(t, c, p.Name, memCounterLoop)
	for _, n := range []int{1, 10} {
		res, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: n})
		if err != nil {
			t.Fatal(err)
		}
		deleteFork(t, c, res)
	}
	at := memCounter(t, c, p.Name)
	res, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 1, IncludeMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the parent used to be stopped 18-80 ms after the capture
	wantParentReady(t, d, p.Name)
	wantCounting(t, c, p.Name, at)
	wantCounting(t, c, res.Sandboxes[0].Name, at)
	deleteFork(t, c, res)
	wantParentReady(t, d, p.Name)
}

// TestMemoryCapturesInARow: 20 memory captures and 20 memory forks in a
// row on a parent that keeps counting. After each, the parent is still
// ready and its counter goes on, and each branch resumes the counter from
// where the parent was.
func TestMemoryCapturesInARow(t *testing.T) {
	ctx := context.Background()
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	base := readySnapshot(t, c, "base", testImage(t))
	p := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "counting" })
	mustRun(t, c, p.Name, memCounterLoop)
	time.Sleep(300 * time.Millisecond)
	for i := range 20 {
		at := memCounter(t, c, p.Name)
		sn, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "cap", IncludeMemory: true})
		if err != nil {
			t.Fatalf("capture %d: %v", i, err)
		}
		wantParentReady(t, d, p.Name)
		wantCounting(t, c, p.Name, at)
		if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
			t.Fatal(err)
		}
		at = memCounter(t, c, p.Name)
		res, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 1, IncludeMemory: true})
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
		wantParentReady(t, d, p.Name)
		wantCounting(t, c, res.Sandboxes[0].Name, at)
		wantCounting(t, c, p.Name, at)
		deleteFork(t, c, res)
	}
}

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// crashOp is one row of TestCrashPoints: an operation the daemon is
// killed in, at point.
type crashOp struct {
	point string
	// variant tells two rows of one point apart ("" for most).
	variant string
	// memory rows need a runtime that captures memory (gVisor).
	memory bool
	// stopVictim stops the victim before the armed daemon starts.
	stopVictim bool
	// victimFiles: the victim's /mine.txt survives (a delete or a reset
	// drops it, as asked).
	victimFiles bool
	do          func(ctx context.Context, c *cubicle.Client, ref, fresh string) error
}

func (o crashOp) name() string {
	if o.variant != "" {
		return o.point + "+" + o.variant
	}
	return o.point
}

// crashOps is every fault point, each with an operation that reaches it.
func crashOps() []crashOp {
	create := func(ctx context.Context, c *cubicle.Client, _, _ string) error {
		_, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "newbox", SnapshotName: "base"})
		return err
	}
	start := func(ctx context.Context, c *cubicle.Client, _, _ string) error { return c.StartSandbox(ctx, "victim") }
	capture := func(memory bool) func(ctx context.Context, c *cubicle.Client, _, _ string) error {
		return func(ctx context.Context, c *cubicle.Client, _, _ string) error {
			_, err := c.CaptureSnapshot(ctx, "victim", protocol.CaptureSnapshotRequest{Name: "cap", IncludeMemory: memory})
			return err
		}
	}
	return []crashOp{
		{point: fault.CreateRecorded, victimFiles: true, do: create},
		{point: fault.BootPrepared, victimFiles: true, do: create},
		{point: fault.StartRecorded, stopVictim: true, victimFiles: true, do: start},
		{point: fault.StartPrepared, stopVictim: true, victimFiles: true, do: start},
		{point: fault.StopHalted, victimFiles: true, do: func(ctx context.Context, c *cubicle.Client, _, _ string) error {
			return c.StopSandbox(ctx, "victim")
		}},
		{point: fault.ResetCleared, do: func(ctx context.Context, c *cubicle.Client, _, _ string) error {
			_, err := c.ResetSandbox(ctx, "victim", "")
			return err
		}},
		{point: fault.CaptureFrozen, victimFiles: true, do: capture(false)},
		{point: fault.CaptureCheckpointed, memory: true, victimFiles: true, do: capture(true)},
		{point: fault.CaptureLayered, victimFiles: true, do: capture(false)},
		{point: fault.CaptureLayered, variant: "memory", memory: true, victimFiles: true, do: capture(true)},
		{point: fault.ForkCaptured, victimFiles: true, do: func(ctx context.Context, c *cubicle.Client, _, _ string) error {
			_, err := c.Fork(ctx, "victim", protocol.ForkRequest{Count: 2})
			return err
		}},
		{point: fault.ForkRecorded, victimFiles: true, do: func(ctx context.Context, c *cubicle.Client, _, _ string) error {
			_, err := c.Fork(ctx, "victim", protocol.ForkRequest{Count: 2})
			return err
		}},
		{point: fault.DeleteTornDown, do: func(ctx context.Context, c *cubicle.Client, _, _ string) error {
			return c.DeleteSandbox(ctx, "victim")
		}},
		{point: fault.ImageUnpacked, victimFiles: true, do: func(ctx context.Context, c *cubicle.Client, _, fresh string) error {
			sn, err := c.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "pulled", DockerImage: fresh, FSCapacityBytes: 1 << 30})
			if err == nil {
				_, err = c.WaitSnapshot(ctx, sn.ID, nil)
			}
			return err
		}},
		{point: fault.BuildStepCaptured, victimFiles: true, do: func(ctx context.Context, c *cubicle.Client, ref, _ string) error {
			sn, err := c.BuildSnapshot(ctx, protocol.BuildSnapshotRequest{Name: "built",
				Dockerfile: "FROM " + ref + "\nRUN echo built > /built\n"}, nil)
			if err == nil {
				_, err = c.WaitSnapshot(ctx, sn.ID, nil)
			}
			return err
		}},
	}
}

// crashImage pushes the busybox image plus a layer no data dir holds yet,
// so a pull of it unpacks a layer.
func crashImage(t testing.TB) string {
	layer := imagetest.Layer(t, imagetest.File("crash.txt", 0o644, "fresh"))
	img, err := mutate.AppendLayers(imagetest.BusyboxImage(t), layer)
	if err != nil {
		t.Fatal(err)
	}
	testImage(t)
	return imagetest.Push(t, registryHost, "cubicle/crash:e2e", img)
}

// TestCrashPoints kills the daemon (SIGKILL, from inside, via
// CUBICLE_FAULT_POINT) at every fault point — between two effects of
// create, start, stop, reset, capture (with and without memory), fork,
// delete, an image pull's unpack and a Dockerfile build step — restarts it,
// and checks: every sandbox is ready, stopped or failed with a reason
// (none stuck provisioning or deleting), every snapshot ready or failed,
// the sandbox that was ready before and not touched is ready again, no
// file of a sandbox that was ready before is lost, the daemon finds no
// leftovers, and once what the operation made is deleted the host counts
// (links, netns, mounts, storage and runtime dirs, loop devices,
// subvolumes, cgroups, runsc containers, nft elements, addresses) are
// what they were before it. One daemon data dir per runtime serves every
// point.
func TestCrashPoints(t *testing.T) {
	ref := testImage(t)
	fresh := crashImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			c := d.Client
			base := readySnapshot(t, c, "base", ref)
			newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "keeper" })
			mustRun(t, c, "keeper", "echo keeper > /mine.txt && sync")
			before := leakCounts(t, d)
			for _, op := range crashOps() {
				if op.memory && rt != "gvisor" {
					continue // the namespace runtime captures no memory
				}
				t.Run(op.name(), func(t *testing.T) {
					t0 := time.Now()
					newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "victim" })
					mustRun(t, c, "victim", "echo victim > /mine.txt && sync")
					if op.stopVictim {
						if err := c.StopSandbox(context.Background(), "victim"); err != nil {
							t.Fatal(err)
						}
					}
					crashAt(t, d, op.point, func(ctx context.Context) error { return op.do(ctx, c, ref, fresh) })
					checkRecovered(t, d, op)
					clearExcept(t, d, "keeper", base.ID)
					if after := leakCounts(t, d); after != before {
						t.Errorf("host counts before %+v, after %+v", before, after)
					}
					t.Logf("%s/%s: %v", rt, op.name(), time.Since(t0).Round(time.Millisecond))
				})
			}
		})
	}
}

// crashAt restarts d armed at point, runs do (which must fail: the daemon
// dies in it), checks the daemon was killed, and starts it again unarmed.
func crashAt(t *testing.T, d *daemon, point string, do func(ctx context.Context) error) {
	t.Helper()
	d.stop()
	d.extraEnv = []string{fault.EnvVar + "=" + point}
	d.start()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := do(ctx)
	cancel()
	if err == nil {
		t.Fatalf("%s: the operation succeeded; the daemon should have died at the point", point)
	}
	t.Logf("%s: the operation failed with %v", point, err)
	exited := make(chan error, 1)
	go func() { exited <- d.cmd.Wait() }()
	select {
	case err := <-exited:
		if err == nil || !strings.Contains(err.Error(), "killed") {
			t.Fatalf("daemon exit: %v, want killed", err)
		}
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-exited
		d.cmd = nil
		t.Fatalf("%s: the operation failed but the daemon did not die at the point", point)
	}
	d.cmd = nil
	d.extraEnv = nil
	d.start()
}

// checkRecovered checks d's records and files after the restart that
// followed a crash in op.
func checkRecovered(t *testing.T, d *daemon, op crashOp) {
	t.Helper()
	c := d.Client
	ctx := context.Background()
	list, err := c.ListSandboxes(ctx, cubicle.ListOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.Sandboxes {
		switch {
		case sb.Name == "keeper" && sb.Status != protocol.StatusReady:
			t.Errorf("keeper, untouched, is %s after the restart (%s)", sb.Status, sb.StatusMessage)
		case sb.Status == protocol.StatusFailed && sb.StatusMessage == "":
			t.Errorf("sandbox %s failed without a reason", sb.Name)
		case sb.Status != protocol.StatusReady && sb.Status != protocol.StatusStopped && sb.Status != protocol.StatusFailed:
			t.Errorf("sandbox %s is %s after the restart (%s)", sb.Name, sb.Status, sb.StatusMessage)
		case sb.Status != protocol.StatusReady:
			if held := instanceHeld(d, sb.ID); held != "" {
				t.Errorf("sandbox %s is %s but still holds %s", sb.Name, sb.Status, held)
			}
		}
	}
	// An interrupted pull resumes; wait for it to settle.
	deadline := time.Now().Add(time.Minute)
	for {
		snaps, err := c.ListSnapshots(ctx, cubicle.ListOptions{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var unsettled []string
		for _, sn := range snaps.Snapshots {
			if sn.Status != protocol.SnapshotReady && sn.Status != protocol.SnapshotFailed {
				unsettled = append(unsettled, sn.Name+" "+sn.Status)
			}
		}
		if len(unsettled) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshots still unsettled a minute after the restart: %v", unsettled)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Files of sandboxes that were ready survive (a stopped one boots
	// again on the exec).
	for _, name := range []string{"keeper", "victim"} {
		if name == "victim" && !op.victimFiles {
			continue
		}
		if got := mustRun(t, c, name, "cat /mine.txt"); got != name+"\n" {
			t.Errorf("%s's file after the crash: %q", name, got)
		}
	}
	switch op.point {
	case fault.DeleteTornDown:
		if _, err := c.GetSandbox(ctx, "victim"); err == nil {
			t.Errorf("victim survived its interrupted delete")
		}
	case fault.ResetCleared:
		if _, _, code := run(t, c, "victim", "test -e /mine.txt"); code == 0 {
			t.Errorf("victim's file survived its interrupted reset")
		}
	}
	left, err := c.Leftovers(ctx)
	if err != nil || len(left) != 0 {
		t.Errorf("leftovers after the restart: %v %v", left, err)
	}
}

// instanceHeld names what sandbox id (not running by its record) still
// holds of a running instance — its netns or its runtime state — or "".
func instanceHeld(d *daemon, id string) string {
	rid := strings.ReplaceAll(id, "-", "")
	for _, p := range []string{filepath.Join("/run/cubicle/netns", rid), filepath.Join(d.dataDir, "runtime", d.runtime, rid)} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// clearExcept deletes every sandbox but keep and every snapshot but
// keepSnap, so the next row starts where this one did.
func clearExcept(t *testing.T, d *daemon, keep, keepSnap string) {
	t.Helper()
	c := d.Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := c.ListSandboxes(ctx, cubicle.ListOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list.Sandboxes {
		if sb.Name != keep {
			if err := c.DeleteSandbox(ctx, sb.Name); err != nil {
				t.Fatalf("delete %s: %v", sb.Name, err)
			}
		}
	}
	snaps, err := c.ListSnapshots(ctx, cubicle.ListOptions{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range snaps.Snapshots {
		if sn.ID != keepSnap {
			if err := c.DeleteSnapshot(ctx, sn.ID); err != nil {
				t.Fatalf("delete snapshot %s: %v", sn.Name, err)
			}
		}
	}
}

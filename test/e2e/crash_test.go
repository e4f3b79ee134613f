package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/fault"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestCrashPoints kills the daemon (SIGKILL, from inside, via
// CUBICLE_FAULT_POINT) between two effects of each lifecycle operation,
// restarts it, and checks: every sandbox is ready, stopped or failed (none
// stuck provisioning or deleting), every snapshot ready or failed, no file
// of a sandbox that was ready before is lost, and no host state is left
// without a record (the daemon's leftovers are none).
func TestCrashPoints(t *testing.T) {
	ref := testImage(t)
	ops := []struct {
		point string
		do    func(ctx context.Context, d *daemon) error
	}{
		{fault.CreateRecorded, func(ctx context.Context, d *daemon) error {
			_, err := d.Client.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "newbox", SnapshotName: "base"})
			return err
		}},
		{fault.BootPrepared, func(ctx context.Context, d *daemon) error {
			_, err := d.Client.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "newbox", SnapshotName: "base"})
			return err
		}},
		{fault.StopHalted, func(ctx context.Context, d *daemon) error { return d.Client.StopSandbox(ctx, "victim") }},
		{fault.CaptureLayered, func(ctx context.Context, d *daemon) error {
			_, err := d.Client.CaptureSnapshot(ctx, "victim", protocol.CaptureSnapshotRequest{Name: "cap"})
			return err
		}},
		{fault.ForkRecorded, func(ctx context.Context, d *daemon) error {
			_, err := d.Client.Fork(ctx, "victim", protocol.ForkRequest{Count: 2})
			return err
		}},
		{fault.DeleteTornDown, func(ctx context.Context, d *daemon) error { return d.Client.DeleteSandbox(ctx, "victim") }},
	}
	for _, rt := range runtimes() {
		for _, op := range ops {
			t.Run(rt+"/"+op.point, func(t *testing.T) {
				d := startDaemon(t, rt, "")
				c := d.Client
				ctx := context.Background()
				base := readySnapshot(t, c, "base", ref)
				for _, name := range []string{"keeper", "victim"} {
					newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = name })
					mustRun(t, c, name, "echo "+name+" > /mine.txt && sync")
				}

				// The same data dir, armed: the operation kills the daemon.
				d.stop()
				d.extraEnv = []string{fault.EnvVar + "=" + op.point}
				d.start()
				opCtx, cancel := context.WithTimeout(ctx, time.Minute)
				err := op.do(opCtx, d)
				cancel()
				if err == nil {
					t.Fatalf("%s: the operation succeeded; the daemon should have died at the point", op.point)
				}
				if err := d.cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
					t.Fatalf("daemon exit: %v, want killed", err)
				}
				d.cmd = nil
				d.extraEnv = nil
				d.start()

				list, err := c.ListSandboxes(ctx, cubicle.ListOptions{Limit: 100})
				if err != nil {
					t.Fatal(err)
				}
				for _, sb := range list.Sandboxes {
					switch sb.Status {
					case protocol.StatusReady, protocol.StatusStopped, protocol.StatusFailed:
					default:
						t.Errorf("sandbox %s is %s after the restart (%s)", sb.Name, sb.Status, sb.StatusMessage)
					}
				}
				snaps, err := c.ListSnapshots(ctx, cubicle.ListOptions{Limit: 100})
				if err != nil {
					t.Fatal(err)
				}
				for _, sn := range snaps.Snapshots {
					if sn.Status != protocol.SnapshotReady && sn.Status != protocol.SnapshotFailed {
						t.Errorf("snapshot %s is %s after the restart", sn.Name, sn.Status)
					}
				}
				// Files of sandboxes that were ready survive (a stopped
				// one boots again on the exec); the deleted one may be
				// gone, which is what was asked.
				for _, name := range []string{"keeper", "victim"} {
					if op.point == fault.DeleteTornDown && name == "victim" {
						if _, err := c.GetSandbox(ctx, name); err == nil {
							t.Errorf("victim survived its interrupted delete")
						}
						continue
					}
					if got := mustRun(t, c, name, "cat /mine.txt"); got != name+"\n" {
						t.Errorf("%s's file after the crash: %q", name, got)
					}
				}
				left, err := c.Leftovers(ctx)
				if err != nil || len(left) != 0 {
					t.Errorf("leftovers after the restart: %v %v", left, err)
				}
			})
		}
	}
}

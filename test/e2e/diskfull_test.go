package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// smallHostFS mounts a fresh 2 GiB ext4 filesystem and returns a data dir
// on it: the host filesystem under the daemon's (sparse, 64 GiB) loop image
// is then what runs out first.
func smallHostFS(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	img, mnt := filepath.Join(base, "host.img"), filepath.Join(base, "host")
	sh(t, "truncate", "-s", "2G", img)
	sh(t, "mkfs.ext4", "-q", "-F", img)
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	sh(t, "mount", "-o", "loop", img, mnt)
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mnt).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v %s", mnt, err, out)
		}
	})
	return filepath.Join(mnt, "data")
}

// TestDiskFull: a sandbox that fills the disk gets EDQUOT/ENOSPC inside
// (never EIO), the store stays writable, a neighbour keeps working, what
// was acknowledged before survives a restart, health says degraded (then
// ok once the space is freed).
func TestDiskFull(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			// The reserve is a third of the disk: filling a share of the
			// room above it brings usable space under twice the reserve.
			d := startDaemonArgs(t, rt, smallHostFS(t), "--store-reserve", "640MiB")
			c := d.Client
			ctx := context.Background()
			if info, err := c.Info(ctx); err != nil || info.Status != "ok" {
				t.Fatalf("health of the empty store: %+v %v", info, err)
			}
			base := readySnapshot(t, c, "base", ref)
			big := func(r *protocol.CreateSandboxRequest) { r.FSCapacityBytes = int64p(8 << 30) } // more than the disk
			filler := newSandbox(t, c, base.ID, big)
			neighbour := newSandbox(t, c, base.ID, big)
			mustRun(t, c, filler.Name, "echo kept > /kept.txt && sync")

			fillUp := func(name string) {
				t.Helper()
				out, _, code := run(t, c, name, "dd if=/dev/zero of=/big bs=1M count=4000 conv=fsync 2>&1; echo rc=$?")
				if code != 0 || strings.Contains(out, "rc=0") || strings.Contains(strings.ToLower(out), "input/output") ||
					!(strings.Contains(out, "quota") || strings.Contains(out, "No space")) {
					t.Fatalf("filling the disk from %s: %q; want a quota or no-space error, never EIO", name, out)
				}
			}
			// The filler is capped at its share of the room: the
			// neighbour still has its own.
			fillUp(filler.Name)
			if got := mustRun(t, c, neighbour.Name, "echo hi > /n.txt && cat /n.txt"); got != "hi\n" {
				t.Fatalf("neighbour after the fill: %q", got)
			}
			// Both full: the store is down to its reserve.
			fillUp(neighbour.Name)
			if got := mustRun(t, c, filler.Name, "cat /kept.txt"); got != "kept\n" {
				t.Fatalf("reading after the fill: %q", got)
			}
			info, err := c.Info(ctx)
			if err != nil || info.Space == nil || info.Space.Store.ReadOnly {
				t.Fatalf("info after the fill: %+v %v", info, err)
			}
			if info.Status == "ok" {
				t.Fatalf("health after the fill is ok (usable %d): want degraded or unavailable", info.Space.Usable)
			}
			t.Logf("after the fill: %s %v", info.Status, info.Reasons)

			mustRun(t, c, filler.Name, "rm -f /big && sync")
			mustRun(t, c, neighbour.Name, "rm -f /big && sync")
			deadline := time.Now().Add(90 * time.Second)
			for {
				if info, err = c.Info(ctx); err == nil && info.Status == "ok" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("health after freeing the space: %+v %v", info, err)
				}
				syscall.Sync()
				time.Sleep(time.Second)
			}
			// Limits follow the freed space at the guard's next step (2 s).
			for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
				_, errs, code := run(t, c, filler.Name, "echo after > /after.txt")
				if code == 0 {
					break
				}
				if time.Since(start) > 10*time.Second {
					t.Fatalf("writing after the space was freed: %s", errs)
				}
			}

			d.stop()
			d.restart()
			if got := mustRun(t, c, filler.Name, "cat /kept.txt /after.txt"); got != "kept\nafter\n" {
				t.Fatalf("acknowledged writes after a restart: %q", got)
			}
		})
	}
}

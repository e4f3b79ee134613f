package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// withVolumes attaches atts to a create request.
func withVolumes(name string, atts ...protocol.VolumeAttachment) func(*protocol.CreateSandboxRequest) {
	return func(r *protocol.CreateSandboxRequest) { r.Name, r.Volumes = name, atts }
}

// timedCreate creates sandbox name (with atts) and returns how long the
// create took.
func timedCreate(t *testing.T, c *cubicle.Client, snapshot, name string, atts ...protocol.VolumeAttachment) time.Duration {
	t0 := time.Now()
	newSandbox(t, c, snapshot, withVolumes(name, atts...))
	return time.Since(t0)
}

// TestVolumesShared: on each runtime, a volume attached to two running
// sandboxes is one directory — each sees the other's writes at once, in
// both directions; a read-only attachment refuses writes; writes past the
// volume's size fail inside with EDQUOT; a capture holds none of its data
// while a fork's branch mounts the same volume; the data outlives the
// sandbox that wrote it and a daemon kill -9; and a volume in use is not
// deleted. Figures: create with a volume vs without.
func TestVolumesShared(t *testing.T) {
	for _, rt := range withMicroVM() {
		t.Run(rt, func(t *testing.T) { testVolumesShared(t, rt) })
	}
}

func testVolumesShared(t *testing.T, rt string) {
	ref := testImage(t)
	d := startDaemon(t, rt, "")
	c := d.Client
	ctx := context.Background()
	base := readySnapshot(t, c, "base", ref)
	if _, err := c.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "data", SizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	rw := func(path string) protocol.VolumeAttachment {
		return protocol.VolumeAttachment{Name: "data", MountPath: path}
	}

	var plain, attached []time.Duration
	for i := range 3 {
		plain = append(plain, timedCreate(t, c, base.ID, "plain-"+string(rune('a'+i))))
		attached = append(attached, timedCreate(t, c, base.ID, "vol-"+string(rune('a'+i)), rw("/data")))
	}
	t.Logf("create (%s, median of 3): without a volume %v, with one %v", rt, median(plain), median(attached))
	for i := range 3 {
		for _, n := range []string{"plain-", "vol-"} {
			if err := c.DeleteSandbox(ctx, n+string(rune('a'+i))); err != nil {
				t.Fatal(err)
			}
		}
	}

	newSandbox(t, c, base.ID, withVolumes("a", rw("/data")))
	newSandbox(t, c, base.ID, withVolumes("b", rw("/mnt/shared")))
	newSandbox(t, c, base.ID, withVolumes("r", protocol.VolumeAttachment{Name: "data", MountPath: "/ro", ReadOnly: true}))
	mustRun(t, c, "a", "echo one > /data/f")
	if out := mustRun(t, c, "b", "cat /mnt/shared/f"); out != "one\n" {
		t.Fatalf("b reads a's write: %q", out)
	}
	// b rewrites the file a created and has read; a sees it at once, and
	// a's append is seen by b (no stale page or dentry caches either way).
	mustRun(t, c, "b", "echo two > /mnt/shared/f && mkdir /mnt/shared/dir && echo x > /mnt/shared/dir/g")
	if out := mustRun(t, c, "a", "cat /data/f /data/dir/g && echo three >> /data/f"); out != "two\nx\n" {
		t.Fatalf("a reads b's rewrite: %q", out)
	}
	if out := mustRun(t, c, "b", "cat /mnt/shared/f && ls /mnt/shared"); out != "two\nthree\ndir\nf\n" {
		t.Fatalf("b reads a's append: %q", out)
	}
	if out := mustRun(t, c, "r", "cat /ro/f"); out != "two\nthree\n" {
		t.Fatalf("read-only attachment reads: %q", out)
	}
	if _, errs, code := run(t, c, "r", "echo no > /ro/x"); code == 0 || !strings.Contains(strings.ToLower(errs), "read-only") {
		t.Fatalf("write to a read-only attachment: exit %d, %q", code, errs)
	}

	// The volume's size is enforced inside: EDQUOT, and the sandbox's own
	// disk is not where the write went.
	_, errs, code := run(t, c, "a", "dd if=/dev/zero of=/data/big bs=1M count=100 conv=fsync")
	if code == 0 || !strings.Contains(strings.ToLower(errs), "quota") {
		t.Fatalf("100 MiB into a 64 MiB volume: exit %d, %q (want EDQUOT: disk quota exceeded)", code, errs)
	}
	mustRun(t, c, "a", "rm /data/big")

	// A capture does not hold the volume's data; a fork mounts the volume.
	capSn, err := c.CaptureSnapshot(ctx, "a", protocol.CaptureSnapshotRequest{Name: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	newSandbox(t, c, capSn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "fromcap" })
	if out := mustRun(t, c, "fromcap", "ls -A /data 2>/dev/null | wc -l"); strings.TrimSpace(out) != "0" {
		t.Fatalf("a sandbox from a capture has the volume's files: %q", out)
	}
	fork, err := c.Fork(ctx, "a", protocol.ForkRequest{Count: 1, Timeout: int64p(90)})
	if err != nil {
		t.Fatal(err)
	}
	branch := fork.Sandboxes[0]
	if len(branch.Volumes) != 1 || branch.Volumes[0].Name != "data" {
		t.Fatalf("fork branch's volumes: %+v", branch.Volumes)
	}
	if out := mustRun(t, c, branch.Name, "cat /data/f"); out != "two\nthree\n" {
		t.Fatalf("fork branch reads the volume: %q", out)
	}

	// The data outlives its writer and a daemon kill -9.
	for _, n := range []string{"a", "fromcap", branch.Name} {
		if err := c.DeleteSandbox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if out := mustRun(t, c, "b", "cat /mnt/shared/f"); out != "two\nthree\n" {
		t.Fatalf("b after a's deletion: %q", out)
	}
	d.kill9()
	d.restart()
	if out := mustRun(t, c, "b", "cat /mnt/shared/f && echo four >> /mnt/shared/f"); out != "two\nthree\n" {
		t.Fatalf("b after a daemon kill -9: %q", out)
	}
	if err := c.StopSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := c.StartSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, c, "b", "cat /mnt/shared/f"); out != "two\nthree\nfour\n" {
		t.Fatalf("b after a restart: %q", out)
	}
	v, err := c.GetVolume(ctx, "data")
	if err != nil || len(v.Attachments) != 2 {
		t.Fatalf("volume after the restart: %+v %v", v, err)
	}
	if err := c.DeleteVolume(ctx, "data"); !cubicle.IsConflict(err) {
		t.Fatalf("delete an attached volume: %v", err)
	}
	for _, n := range []string{"b", "r"} {
		if err := c.DeleteSandbox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteVolume(ctx, "data"); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeSnapshotCloneCoW: a snapshot of a volume holding 1 GiB and a
// clone of it are copy-on-write — each made in well under 100 ms, holding
// next to no bytes of its own — and the clone has the data, changes
// independently of the snapshot, and the original keeps its own.
func TestVolumeSnapshotCloneCoW(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	ctx := context.Background()
	base := readySnapshot(t, c, "base", ref)
	if _, err := c.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "big", SizeBytes: 2 << 30}); err != nil {
		t.Fatal(err)
	}
	newSandbox(t, c, base.ID, withVolumes("w", protocol.VolumeAttachment{Name: "big", MountPath: "/big"}))
	mustRun(t, c, "w", "dd if=/dev/zero of=/big/blob bs=4M count=256 conv=fsync 2>/dev/null && echo original > /big/note && sync")

	t0 := time.Now()
	snap, err := c.SnapshotVolume(ctx, "big", "gig")
	tSnap := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	clone, err := c.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "clone", FromSnapshot: "gig"})
	tClone := time.Since(t0)
	if err != nil {
		t.Fatal(err)
	}
	if clone.SizeBytes != 2<<30 || clone.FromSnapshot != snap.ID {
		t.Fatalf("clone: %+v", clone)
	}
	got, err := c.GetVolume(ctx, "clone")
	if err != nil || got.UsedBytes == nil {
		t.Fatalf("clone's usage: %+v %v", got, err)
	}
	snaps, err := c.ListVolumeSnapshots(ctx)
	if err != nil || len(snaps) != 1 || snaps[0].UsedBytes == nil {
		t.Fatalf("snapshots: %+v %v", snaps, err)
	}
	t.Logf("1 GiB volume: snapshot %v, clone %v (API round trips); exclusive bytes: clone %d, snapshot %d",
		tSnap, tClone, *got.UsedBytes, *snaps[0].UsedBytes)
	if tSnap > 100*time.Millisecond || tClone > 100*time.Millisecond {
		t.Errorf("snapshot %v / clone %v of 1 GiB: want ≤ 100 ms each (copy-on-write)", tSnap, tClone)
	}
	if *got.UsedBytes > 1<<20 {
		t.Errorf("a fresh clone of 1 GiB holds %d bytes of its own: its data was copied", *got.UsedBytes)
	}

	newSandbox(t, c, base.ID, withVolumes("v", protocol.VolumeAttachment{Name: "clone", MountPath: "/c"}))
	if out := mustRun(t, c, "v", "stat -c %s /c/blob && cat /c/note && echo clone > /c/note"); out != "1073741824\noriginal\n" {
		t.Fatalf("the clone's data: %q", out)
	}
	if out := mustRun(t, c, "w", "cat /big/note"); out != "original\n" {
		t.Fatalf("the original after a write to its clone: %q", out)
	}
	for _, n := range []string{"w", "v"} {
		if err := c.DeleteSandbox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for _, rm := range []func() error{
		func() error { return c.DeleteVolume(ctx, "big") },
		func() error { return c.DeleteVolumeSnapshot(ctx, "gig") },
		func() error { return c.DeleteVolume(ctx, "clone") },
	} {
		if err := rm(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVolumesAcrossMemoryRestore: on gVisor, a sandbox's volume is bound
// in again when a memory-preserving stop is restored and in each branch
// of a memory fork: the resumed processes keep writing to the volume, and
// what another sandbox wrote to it meanwhile is what they read (nothing
// stale from the memory image).
func TestVolumesAcrossMemoryRestore(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	ctx := context.Background()
	base := readySnapshot(t, c, "base", ref)
	if _, err := c.CreateVolume(ctx, protocol.CreateVolumeRequest{Name: "data", SizeBytes: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	at := protocol.VolumeAttachment{Name: "data", MountPath: "/data"}
	preserve := true
	m := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) {
		r.Name, r.Volumes, r.PreserveMemoryOnStop = "m", []protocol.VolumeAttachment{at}, &preserve
	})
	newSandbox(t, c, base.ID, withVolumes("w", at))
	mustRun(t, c, "m", "echo before > /data/f && cat /data/f >/dev/null && "+
		"setsid sh -c 'while true; do echo $$ >> /data/ticks; sleep 0.2; done' </dev/null >/dev/null 2>&1 &")
	stopPreserving(t, d, m)
	mustRun(t, c, "w", "echo while-stopped > /data/f && : > /data/ticks")
	if err := c.StartSandbox(ctx, "m"); err != nil {
		t.Fatal(err)
	}
	got, err := c.GetSandbox(ctx, "m")
	if err != nil || strings.Contains(got.StatusMessage, "not restored") {
		t.Fatalf("after the start: %+v %v", got, err)
	}
	if out := mustRun(t, c, "m", "cat /data/f"); out != "while-stopped\n" {
		t.Fatalf("the restored sandbox reads %q, want what w wrote while it was stopped", out)
	}
	ticking := func(name string) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if out := mustRun(t, c, "w", "wc -l < /data/ticks"); strings.TrimSpace(out) != "0" {
				return
			}
		}
		t.Fatalf("%s: the resumed loop does not write to the volume", name)
	}
	ticking("restored")
	fork, err := c.Fork(ctx, "m", protocol.ForkRequest{Count: 1, IncludeMemory: true, Timeout: int64p(90)})
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, "m", "kill $(head -1 /data/ticks) && : > /data/ticks")
	ticking("memory fork branch")
	if out := mustRun(t, c, fork.Sandboxes[0].Name, "cat /data/f"); out != "while-stopped\n" {
		t.Fatalf("the memory fork's branch reads %q", out)
	}
}

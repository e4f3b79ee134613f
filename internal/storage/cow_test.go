package storage

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

func needRoot(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t, "loop-mounts btrfs")
}

// loopStore opens a CoW store on a fresh (non-btrfs) temp dir, which makes
// it a loop-mounted btrfs image, and unmounts it at test end.
func loopStore(t *testing.T) (*CoW, string) {
	t.Helper()
	return loopStoreSized(t, 2<<30)
}

// loopStoreSized is loopStore with a store of size bytes.
func loopStoreSized(t *testing.T, size int64) (*CoW, string) {
	t.Helper()
	needRoot(t)
	if !haveBtrfsTools() {
		testenv.Skip(t, "btrfs-progs not installed")
	}
	dir := t.TempDir()
	c, err := OpenCoW(context.Background(), dir, WithImageSize(size), WithBackend(BackendBtrfsLoop))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Unmount() })
	return c, dir
}

func TestLoopImageLifecycle(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	if c.Backend() != BackendBtrfsLoop || !isBtrfs(c.Root()) {
		t.Fatalf("backend %s, root on btrfs %v", c.Backend(), isBtrfs(c.Root()))
	}
	fi, err := os.Stat(c.Image())
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(c.Image(), &st)
	if fi.Size() != 2<<30 || st.Blocks*512 > 512<<20 {
		t.Fatalf("image size %d allocated %d: want sparse 2 GiB", fi.Size(), st.Blocks*512)
	}
	vol := filepath.Join(c.Root(), volSandboxes, "a")
	if err := c.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(vol, "f"), []byte("kept"), 0o644)

	// A second open while mounted (daemon restart) reuses the mount.
	c2, err := OpenCoW(ctx, dir)
	if err != nil || c2.Backend() != BackendBtrfsLoop {
		t.Fatalf("reopen: %v %v", c2, err)
	}
	// After an unmount (host reboot) it mounts the same image again.
	if err := c.Unmount(); err != nil {
		t.Fatal(err)
	}
	c3, err := OpenCoW(ctx, dir)
	if err != nil || c3.Backend() != BackendBtrfsLoop {
		t.Fatalf("remount: %v %v", c3, err)
	}
	if b, err := os.ReadFile(filepath.Join(vol, "f")); err != nil || string(b) != "kept" {
		t.Fatalf("after remount: %q %v", b, err)
	}
}

func TestSubvolumeSnapshotDelete(t *testing.T) {
	c, _ := loopStore(t)
	ctx := context.Background()
	src := filepath.Join(c.Root(), volSandboxes, "src")
	if err := c.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	if !isSubvolume(src) {
		t.Fatal("created volume is not a subvolume")
	}
	os.WriteFile(filepath.Join(src, "a"), []byte("one"), 0o644)
	ro := filepath.Join(c.Root(), volSnapshots, "ro")
	if err := c.Snapshot(ctx, src, ro, true); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "b"), nil, 0o644); err == nil {
		t.Fatal("read-only snapshot is writable")
	}
	rw := filepath.Join(c.Root(), volSandboxes, "rw")
	if err := c.Snapshot(ctx, ro, rw, false); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(rw, "a"), []byte("two"), 0o644)
	os.WriteFile(filepath.Join(src, "a"), []byte("three"), 0o644)
	for p, want := range map[string]string{ro: "one", rw: "two", src: "three"} {
		if b, _ := os.ReadFile(filepath.Join(p, "a")); string(b) != want {
			t.Errorf("%s/a = %q, want %q", p, b, want)
		}
	}
	for _, p := range []string{rw, ro, src} {
		if err := c.Delete(ctx, p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s still exists: %v", p, err)
		}
	}
	if err := c.Delete(ctx, src); err != nil {
		t.Fatalf("deleting a missing volume: %v", err)
	}
}

func TestExclusiveBytes(t *testing.T) {
	c, _ := loopStore(t)
	ctx := context.Background()
	src := filepath.Join(c.Root(), volSandboxes, "src")
	c.Create(ctx, src)
	data := bytes.Repeat([]byte{'x'}, 8<<20)
	os.WriteFile(filepath.Join(src, "big"), data, 0o644)
	snap := filepath.Join(c.Root(), volSnapshots, "s")
	if err := c.Snapshot(ctx, src, snap, true); err != nil {
		t.Fatal(err)
	}
	branch := filepath.Join(c.Root(), volSandboxes, "b")
	c.Snapshot(ctx, snap, branch, false)
	os.WriteFile(filepath.Join(branch, "own"), bytes.Repeat([]byte{'y'}, 4<<20), 0o644)
	// Counts are as of the last commit; a read asks for one in the
	// background, so without any sync of ours they catch up.
	var got map[string]int64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if got, err = c.ExclusiveBytes(ctx, src, snap, branch); err != nil {
			t.Fatal(err)
		}
		if got[branch] >= 4<<20 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("exclusive: %v", got)
	// The 8 MiB file is shared by all three: nobody owns it exclusively.
	if got[src] > 1<<20 || got[snap] > 1<<20 {
		t.Errorf("shared data counted as exclusive: %v", got)
	}
	if got[branch] < 4<<20 || got[branch] > 5<<20 {
		t.Errorf("branch exclusive = %d, want ~4 MiB", got[branch])
	}
}

// TestExclusiveBytesDoesNotWaitForWrites: a usage read while another
// volume holds much unwritten data answers from the committed counts at
// once; before, each read synced the whole store first and so waited for
// every sandbox's writeback.
func TestExclusiveBytesDoesNotWaitForWrites(t *testing.T) {
	c, _ := loopStore(t)
	ctx := context.Background()
	busy, idle := filepath.Join(c.Root(), volSandboxes, "busy"), filepath.Join(c.Root(), volSandboxes, "idle")
	c.Create(ctx, busy)
	c.Create(ctx, idle)
	if _, err := c.ExclusiveBytes(ctx, idle); err != nil {
		t.Fatal(err)
	}
	c.bg.Wait() // the first read's background commit
	f, err := os.Create(filepath.Join(busy, "dirty"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{'z'}, 1<<20)
	for range 256 { // 256 MiB in the page cache, not yet written back
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if _, err := c.ExclusiveBytes(ctx, idle); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("usage read with 256 MiB dirty elsewhere: %v", took)
	if took > 50*time.Millisecond {
		t.Fatalf("usage read took %v: it waited for another volume's writeback", took)
	}
}

func TestCopyBackend(t *testing.T) {
	needRoot(t)
	ctx := context.Background()
	c, err := OpenCoW(ctx, t.TempDir(), WithBackend(BackendCopy))
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(c.Root(), volSandboxes, "src")
	c.Create(ctx, src)
	os.WriteFile(filepath.Join(src, "a"), []byte("one"), 0o600)
	unix.Mknod(filepath.Join(src, "wh"), unix.S_IFCHR, 0)
	dst := filepath.Join(c.Root(), volSnapshots, "s")
	if err := c.Snapshot(ctx, src, dst, true); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dst, "wh"), &st); err != nil || !isWhiteout(&st) {
		t.Fatalf("whiteout not copied: %v", err)
	}
	got, err := c.ExclusiveBytes(ctx, dst)
	if err != nil || got[dst] == 0 {
		t.Fatalf("usage %v %v", got, err)
	}
}

// TestDiskUsageStaysInTree: the copy backend's usage walk is over a
// sandbox's tree; a symlink it planted to a host directory is not counted.
func TestDiskUsageStaysInTree(t *testing.T) {
	vol, host := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(host, "big"), make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(vol, "small"), []byte("x"), 0o600)
	os.Symlink(host, filepath.Join(vol, "host"))
	n, err := diskUsage(context.Background(), vol)
	if err != nil || n <= 0 || n >= 8<<20 {
		t.Fatalf("diskUsage = %d, %v; want the tree's few KiB, not the host dir's 8 MiB", n, err)
	}
}

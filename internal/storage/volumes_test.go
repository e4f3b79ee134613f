package storage

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// writeUntil writes 1 MiB chunks (synced) to path until n MiB are written
// or a write fails, returning that failure.
func writeUntil(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := bytes.Repeat([]byte{'v'}, 1<<20)
	for range n {
		if _, err := f.Write(chunk); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// TestVolumeLifecycle: a volume is limited to its size (EDQUOT past it), a
// snapshot is read-only and keeps the data as of when it was taken, a
// clone shares it (exclusive bytes stay near zero until written) and may
// change without touching the snapshot, and everything is removable.
func TestVolumeLifecycle(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	o, err := New(filepath.Join(dir, "sandboxes"), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := o.CreateVolume(ctx, "v1", 16<<20); err != nil || !ok {
		t.Fatalf("CreateVolume: enforced %v, %v", ok, err)
	}
	vol := o.VolumePath("v1")
	if err := writeUntil(filepath.Join(vol, "big"), 32); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("32 MiB into a 16 MiB volume: %v, want EDQUOT", err)
	}
	os.Remove(filepath.Join(vol, "big"))
	if err := writeUntil(filepath.Join(vol, "data"), 8); err != nil {
		t.Fatalf("8 MiB into a 16 MiB volume: %v", err)
	}
	if err := o.SnapshotVolume(ctx, "v1", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.volumeSnapshotPath("s1"), "x"), nil, 0o644); err == nil {
		t.Fatal("wrote into a read-only volume snapshot")
	}
	if err := os.WriteFile(filepath.Join(vol, "later"), []byte("after the snapshot"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, err := o.CloneVolume(ctx, "s1", "v2", 64<<20); err != nil || !ok {
		t.Fatalf("CloneVolume: enforced %v, %v", ok, err)
	}
	clone := o.VolumePath("v2")
	if fi, err := os.Stat(filepath.Join(clone, "data")); err != nil || fi.Size() != 8<<20 {
		t.Fatalf("clone's data: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(clone, "later")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("clone has a file written after the snapshot: %v", err)
	}
	if _, err := btrfsCmd(ctx, "filesystem", "sync", c.Root()); err != nil {
		t.Fatal(err)
	}
	use, err := o.VolumeUsage(ctx, []string{"v1", "v2"}, []string{"s1"})
	if err != nil {
		t.Fatal(err)
	}
	if use["v2"] > 1<<20 {
		t.Fatalf("a fresh clone holds %d exclusive bytes: its data is copied, not shared", use["v2"])
	}
	if err := os.WriteFile(filepath.Join(clone, "data"), []byte("rewritten"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(o.volumeSnapshotPath("s1"), "data")); err != nil || fi.Size() != 8<<20 {
		t.Fatalf("snapshot changed by a write to its clone: %v %v", fi, err)
	}
	for _, rm := range []func() error{
		func() error { return o.RemoveVolumeSnapshot(ctx, "s1") },
		func() error { return o.RemoveVolume(ctx, "v1") },
		func() error { return o.RemoveVolume(ctx, "v2") },
		func() error { return o.RemoveVolume(ctx, "v2") }, // missing: fine
	} {
		if err := rm(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{vol, clone, o.volumeSnapshotPath("s1")} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s after removal: %v", p, err)
		}
	}
}

// TestQuarantineVolumeFiles: a volume's and a (read-only) volume
// snapshot's files move aside under orphans, intact, and are listed until
// then.
func TestQuarantineVolumeFiles(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	o, err := New(filepath.Join(dir, "sandboxes"), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.CreateVolume(ctx, "v", 16<<20); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.VolumePath("v"), "f"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := o.SnapshotVolume(ctx, "v", "s"); err != nil {
		t.Fatal(err)
	}
	for _, snap := range []bool{false, true} {
		ids, err := o.ListVolumeFiles(ctx, snap)
		if err != nil || len(ids) != 1 {
			t.Fatalf("list (snapshots %v): %v %v", snap, ids, err)
		}
		moved, err := o.QuarantineVolumeFiles(ctx, snap, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(moved, "f")); err != nil || string(b) != "kept" {
			t.Fatalf("moved files: %q %v", b, err)
		}
		if ids, err := o.ListVolumeFiles(ctx, snap); err != nil || len(ids) != 0 {
			t.Fatalf("listed after the move: %v %v", ids, err)
		}
	}
}

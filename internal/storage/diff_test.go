package storage

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func write(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// TestOverlayCaptureDiff builds a rootfs over a base layer, changes it
// through the overlay, captures the upper as a layer, boots a branch over
// base+capture and checks what the branch sees and what Diff reports.
func TestOverlayCaptureDiff(t *testing.T) {
	c, _ := loopStore(t)
	ctx := context.Background()
	base := t.TempDir()
	write(t, base+"/etc/keep", "k", 0o644)
	write(t, base+"/etc/gone", "g", 0o644)
	write(t, base+"/etc/mod", "aaaa", 0o644)
	write(t, base+"/etc/chm", "c", 0o644)
	write(t, base+"/etc/old", "r", 0o644)
	write(t, base+"/tree/x/y", "deep", 0o644)

	o, err := New(t.TempDir(), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := o.Mount(ctx, "p", []string{base})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Remove(ctx, "p")
	write(t, rootfs+"/etc/new", "n", 0o644)
	os.Remove(rootfs + "/etc/gone")
	time.Sleep(10 * time.Millisecond)
	write(t, rootfs+"/etc/mod", "bbbb", 0o644) // same size, new content
	os.Chmod(rootfs+"/etc/chm", 0o600)
	os.Rename(rootfs+"/etc/old", rootfs+"/etc/renamed")
	os.RemoveAll(rootfs + "/tree")

	layer, err := o.Capture(ctx, "p", "s1")
	if err != nil {
		t.Fatal(err)
	}
	defer o.RemoveCapture(ctx, "s1")
	snapLayers := []string{base, layer}
	// Diff base → snapshot.
	got, err := Diff(ctx, []string{base}, snapLayers)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{
		{"/etc/chm", Modified, 1}, {"/etc/gone", Deleted, 1}, {"/etc/mod", Modified, 4},
		{"/etc/new", Added, 1}, {"/etc/old", Deleted, 1}, {"/etc/renamed", Added, 1},
		{"/tree", Deleted, 0}, {"/tree/x", Deleted, 0}, {"/tree/x/y", Deleted, 4},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("diff:\n got %v\nwant %v", got, want)
	}

	// A branch over base+capture sees the parent's state and diverges.
	broot, err := o.Mount(ctx, "b", snapLayers)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Remove(ctx, "b")
	if _, err := os.Stat(broot + "/etc/gone"); !os.IsNotExist(err) {
		t.Fatalf("whiteout in captured layer not honoured: %v", err)
	}
	if b, _ := os.ReadFile(broot + "/etc/mod"); string(b) != "bbbb" {
		t.Fatalf("branch sees %q", b)
	}
	write(t, broot+"/etc/branch", "b", 0o644)
	if _, err := os.Stat(rootfs + "/etc/branch"); !os.IsNotExist(err) {
		t.Fatal("branch write visible in parent")
	}
	got, err = Diff(ctx, snapLayers, append(snapLayers[:2:2], o.UpperDir("b")))
	if err != nil {
		t.Fatal(err)
	}
	if want := []Change{{"/etc/branch", Added, 1}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("branch diff: got %v want %v", got, want)
	}
	// Parent (live upper) against its own capture: nothing changed yet.
	got, _ = Diff(ctx, snapLayers, []string{base, o.UpperDir("p")})
	if len(got) != 0 {
		t.Fatalf("parent vs its capture: %v", got)
	}
	var st unix.Stat_t
	if unix.Lstat(layer+"/etc/gone", &st) != nil || !isWhiteout(&st) {
		t.Fatal("captured layer lacks the whiteout")
	}
}

package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
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

// TestDiffStaysInLayers: Diff reads a live upper dir while its sandbox
// runs. A sandbox that plants symlinks and FIFOs, and keeps swapping a
// directory for a symlink to a host directory, must not make Diff list
// host files or block; nor may sparse files make it read past its
// caller's deadline.
func TestDiffStaysInLayers(t *testing.T) {
	ctx := context.Background()
	base, upper, host := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, host+"/host-secret", "host", 0o600)
	write(t, upper+"/sw/a/inside", "x", 0o644)
	os.Symlink(host, upper+"/link")
	unix.Mkfifo(upper+"/fifo", 0o644)

	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the sandbox, racing the walk: sw/a flips dir <-> symlink
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			os.Rename(upper+"/sw/a", upper+"/sw/a.real")
			os.Symlink(host, upper+"/sw/a")
			time.Sleep(time.Microsecond)
			os.Remove(upper + "/sw/a")
			os.Rename(upper+"/sw/a.real", upper+"/sw/a")
		}
	}()
	deadline := time.Now().Add(time.Second)
	runs := 0
	for time.Now().Before(deadline) {
		got, err := Diff(ctx, []string{base}, []string{base, upper})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range got {
			if strings.Contains(c.Path, "host-secret") {
				t.Fatalf("diff listed a host file: %v", got)
			}
		}
		runs++
	}
	close(stop)
	<-done
	t.Logf("%d diffs while racing", runs)

	// Same size as base's, different mtime: Diff must hash 16 GiB of holes,
	// and stops when its caller gives up.
	for _, l := range []string{base, upper} {
		write(t, l+"/etc/big", "", 0o644)
		if err := os.Truncate(l+"/etc/big", 8<<30); err != nil {
			t.Fatal(err)
		}
	}
	os.Chtimes(upper+"/etc/big", time.Now(), time.Now().Add(time.Hour))
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := Diff(ctx, []string{base}, []string{base, upper})
	if took := time.Since(t0); !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
		t.Fatalf("diff of 16 GiB of holes under a 50ms deadline: %v after %s", err, took)
	}
}

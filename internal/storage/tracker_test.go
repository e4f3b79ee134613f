package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// kinds is a scan's result as path → kind.
func kinds(cs []FileChange) map[string]string {
	m := map[string]string{}
	for _, c := range cs {
		m[c.Path] = c.Kind
	}
	return m
}

func scanWant(t *testing.T, tr *Tracker, want map[string]string) []FileChange {
	t.Helper()
	cs, err := tr.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(cs); !reflect.DeepEqual(got, want) {
		t.Fatalf("scan:\n got %v\nwant %v", got, want)
	}
	return cs
}

func change(cs []FileChange, p string) FileChange {
	for _, c := range cs {
		if c.Path == p {
			return c
		}
	}
	return FileChange{}
}

// TestTracker changes a sandbox's rootfs through its overlay, scan after
// scan, on btrfs (generation-based) and on the copy backend (walks), and
// checks each scan reports exactly what changed since the last.
func TestTracker(t *testing.T) {
	for _, backend := range []string{BackendBtrfsLoop, BackendCopy} {
		t.Run(backend, func(t *testing.T) {
			c, _ := loopStore(t)
			if backend == BackendCopy {
				var err error
				if c, err = OpenCoW(context.Background(), t.TempDir(), WithBackend(BackendCopy)); err != nil {
					t.Fatal(err)
				}
			}
			testTracker(t, c)
		})
	}
}

func testTracker(t *testing.T, c *CoW) {
	ctx := context.Background()
	base := t.TempDir()
	write(t, base+"/etc/keep", "k", 0o644)
	write(t, base+"/etc/gone", "g", 0o644)
	write(t, base+"/etc/mod", "aaaa", 0o644)
	write(t, base+"/etc/chm", "c", 0o644)
	write(t, base+"/etc/old", "r", 0o644)
	write(t, base+"/tree/x/y", "deep", 0o644)
	write(t, base+"/opq/a", "a", 0o644)
	write(t, base+"/opq/b", "b", 0o644)
	o, err := New(t.TempDir(), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := o.Mount(ctx, "p", []string{base})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Remove(ctx, "p")
	write(t, rootfs+"/pre", "before tracking", 0o644)
	tr, err := NewTracker(ctx, o.UpperDir("p"), []string{base})
	if err != nil {
		t.Fatal(err)
	}
	if (c.Backend() != BackendCopy) != (tr.vol != "") {
		t.Fatalf("backend %s: tracker on subvolume %q", c.Backend(), tr.vol)
	}
	if !tr.Tracks("/pre") || tr.Tracks("/etc/keep") {
		t.Fatal("index does not hold exactly the upper")
	}
	scanWant(t, tr, map[string]string{})

	// Lower files modified, chmod'ed, deleted, renamed, a lower tree
	// removed (a whiteout hides it), new files and directories.
	write(t, rootfs+"/new", "n", 0o644)
	write(t, rootfs+"/d/f", "ff", 0o600)
	write(t, rootfs+"/etc/mod", "bbbbb", 0o644)
	must(t, os.Chmod(rootfs+"/etc/chm", 0o600))
	must(t, os.Remove(rootfs+"/etc/gone"))
	must(t, os.Rename(rootfs+"/etc/old", rootfs+"/etc/renamed"))
	must(t, os.RemoveAll(rootfs+"/tree"))
	cs := scanWant(t, tr, map[string]string{
		"/new": Added, "/d": Added, "/d/f": Added, "/etc/renamed": Added,
		"/etc/mod": Modified, "/etc/chm": Modified,
		"/etc/gone": Deleted, "/etc/old": Deleted, "/tree": Deleted, "/tree/x": Deleted, "/tree/x/y": Deleted,
	})
	if m := change(cs, "/etc/mod"); m.SizeBefore != 4 || m.Size != 5 {
		t.Errorf("/etc/mod size %d -> %d, want 4 -> 5", m.SizeBefore, m.Size)
	}
	if m := change(cs, "/etc/chm"); m.ModeBefore != 0o644 || m.Mode != 0o600 {
		t.Errorf("/etc/chm mode %v -> %v, want 0644 -> 0600", m.ModeBefore, m.Mode)
	}
	if a := change(cs, "/d/f"); a.Size != 2 || a.Mode != 0o600 {
		t.Errorf("/d/f %+v", a)
	}
	scanWant(t, tr, map[string]string{})

	// Upper files changed, an upper-only tree removed, an upper file
	// renamed; a lower dir removed and made again (opaque).
	time.Sleep(10 * time.Millisecond)
	write(t, rootfs+"/new", "nn", 0o644)
	must(t, os.RemoveAll(rootfs+"/d"))
	must(t, os.Rename(rootfs+"/etc/renamed", rootfs+"/etc/r2"))
	must(t, os.Remove(rootfs+"/pre"))
	must(t, os.RemoveAll(rootfs+"/opq"))
	write(t, rootfs+"/opq/a", "a2", 0o644)
	scanWant(t, tr, map[string]string{
		"/new": Modified, "/etc/r2": Added, "/opq/a": Modified,
		"/d": Deleted, "/d/f": Deleted, "/etc/renamed": Deleted, "/pre": Deleted, "/opq/b": Deleted,
	})

	// A file deleted and made again is added; a read changes nothing.
	must(t, os.Remove(rootfs+"/etc/keep"))
	scanWant(t, tr, map[string]string{"/etc/keep": Deleted})
	write(t, rootfs+"/etc/keep", "k2", 0o644)
	if _, err := os.ReadFile(rootfs + "/etc/mod"); err != nil {
		t.Fatal(err)
	}
	scanWant(t, tr, map[string]string{"/etc/keep": Added})

	// An append to a file the index holds (`echo >> f`) is a modification:
	// on btrfs it may give the file a new extent without moving its inode
	// item's transid.
	f, err := os.OpenFile(rootfs+"/etc/keep", os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteString(" and more\n")
	must(t, err)
	must(t, f.Close())
	scanWant(t, tr, map[string]string{"/etc/keep": Modified})
}

// TestTrackerManyFiles checks a scan of 10,000 new files stays under the
// record's bound (1 s) and reports each.
func TestTrackerManyFiles(t *testing.T) {
	c, _ := loopStore(t)
	ctx := context.Background()
	o, err := New(t.TempDir(), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	write(t, base+"/etc/keep", "k", 0o644)
	rootfs, err := o.Mount(ctx, "p", []string{base})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Remove(ctx, "p")
	tr, err := NewTracker(ctx, o.UpperDir("p"), []string{base})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	scanWant(t, tr, map[string]string{})
	t.Logf("no-op scan: %v", time.Since(start))
	for i := range 10000 {
		write(t, fmt.Sprintf("%s/many/%02d/f%d", rootfs, i%100, i), "x", 0o644)
	}
	start = time.Now()
	cs, err := tr.Scan(ctx)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("10,000-file scan: %v, %d changes", took, len(cs))
	if len(cs) != 10000+100+1 {
		t.Fatalf("%d changes, want 10101", len(cs))
	}
	if took > time.Second {
		t.Fatalf("scan took %v, over 1 s", took)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReadLayered reads files as the merged view shows them: the top
// layer wins, a whiteout hides, and no symlink is followed.
func TestReadLayered(t *testing.T) {
	needRoot(t) // whiteouts are device nodes
	ctx := context.Background()
	lower, upper := t.TempDir(), t.TempDir()
	write(t, lower+"/a", "lower a", 0o644)
	write(t, lower+"/b", "lower b", 0o644)
	write(t, lower+"/c", "lower c", 0o644)
	write(t, upper+"/a", "upper a", 0o644)
	must(t, unix.Mknod(upper+"/b", unix.S_IFCHR, 0))
	must(t, os.Symlink(lower+"/c", upper+"/l"))
	stack := []string{lower, upper}
	if b, err := ReadLayered(ctx, stack, "/a", 100); err != nil || string(b) != "upper a" {
		t.Fatalf("a = %q, %v", b, err)
	}
	if b, err := ReadLayered(ctx, stack, "c", 100); err != nil || string(b) != "lower c" {
		t.Fatalf("c = %q, %v", b, err)
	}
	if _, err := ReadLayered(ctx, stack, "b", 100); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("whited-out b: %v", err)
	}
	if b, err := ReadLayered(ctx, stack, "l", 100); err == nil {
		t.Fatalf("symlink followed: %q", b)
	}
	if _, err := ReadLayered(ctx, stack, "a", 3); err == nil {
		t.Fatal("read past the cap")
	}
}

// TestTrackerIndexCap checks a full index says so.
func TestTrackerIndexCap(t *testing.T) {
	ctx := context.Background()
	upper := t.TempDir()
	tr, err := NewTracker(ctx, upper, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.limit = 3
	for i := range 5 {
		write(t, fmt.Sprintf("%s/f%d", upper, i), "x", 0o644)
	}
	cs, err := tr.Scan(ctx)
	if err != nil || len(cs) != 5 {
		t.Fatalf("scan: %v %v", cs, err)
	}
	if !tr.Incomplete() || tr.nodes != 3 {
		t.Fatalf("index of %d paths, incomplete %v; want 3, true", tr.nodes, tr.Incomplete())
	}
}

// TestTrackerTooManyChanges: a scan whose candidate paths would exceed
// maxScanPathBytes holds none of them, rebuilds the index and says so, and
// the next scan reports only what changes after it.
func TestTrackerTooManyChanges(t *testing.T) {
	c, _ := loopStore(t)
	ctx := context.Background()
	o, err := New(t.TempDir(), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	rootfs, err := o.Mount(ctx, "p", []string{t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Remove(ctx, "p")
	tr, err := NewTracker(ctx, o.UpperDir("p"), nil)
	if err != nil {
		t.Fatal(err)
	}
	deep := rootfs + "/" + strings.Repeat(strings.Repeat("d", 200)+"/", 10)
	must(t, os.MkdirAll(deep, 0o755))
	for i := range maxScanPathBytes/2000 + 100 {
		write(t, fmt.Sprintf("%s%d", deep, i), "", 0o644)
	}
	if _, err := tr.Scan(ctx); !errors.Is(err, ErrTooManyChanges) {
		t.Fatalf("scan of %d MiB of paths: %v, want ErrTooManyChanges", maxScanPathBytes>>20, err)
	}
	write(t, rootfs+"/after", "a", 0o644)
	scanWant(t, tr, map[string]string{"/after": Added})
}

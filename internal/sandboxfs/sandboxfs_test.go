package sandboxfs

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tree is a stand-in for a sandbox's rootfs with a host file beside it.
func tree(t *testing.T) (*Tree, string, string) {
	t.Helper()
	base := t.TempDir()
	dir := filepath.Join(base, "rootfs")
	host := filepath.Join(base, "host-secret")
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(host, []byte("host data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := OpenTree(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root, dir, host
}

func TestReadFileSparseHugeIsBounded(t *testing.T) {
	root, dir, _ := tree(t)
	f, err := os.Create(filepath.Join(dir, "etc/bundle.crt"))
	if err != nil {
		t.Fatal(err)
	}
	// What `truncate -s 100G` inside a sandbox leaves: stat says 100 GiB.
	if err := f.Truncate(100 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	const max = 1 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	b, err := root.ReadFile(context.Background(), "/etc/bundle.crt", max)
	took := time.Since(t0)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrTooLarge) || b != nil {
		t.Fatalf("ReadFile(100 GiB sparse) = %d bytes, %v; want ErrTooLarge", len(b), err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8*max {
		t.Errorf("reading a 100 GiB sparse file under a %d-byte cap allocated %d bytes", max, alloc)
	}
	if took > time.Second {
		t.Errorf("took %s", took)
	}
	t.Logf("100 GiB sparse file refused in %s, %d bytes allocated", took, after.TotalAlloc-before.TotalAlloc)
}

func TestReadFileAtCap(t *testing.T) {
	root, dir, _ := tree(t)
	os.WriteFile(filepath.Join(dir, "etc/f"), []byte("12345"), 0o644)
	if b, err := root.ReadFile(context.Background(), "etc/f", 5); err != nil || string(b) != "12345" {
		t.Errorf("at cap: %q, %v", b, err)
	}
	if _, err := root.ReadFile(context.Background(), "etc/f", 4); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over cap: %v; want ErrTooLarge", err)
	}
	if _, err := root.ReadFile(context.Background(), "etc/missing", 4); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: %v; want ErrNotExist", err)
	}
}

func TestReadFileFIFOFailsAtOnce(t *testing.T) {
	root, dir, _ := tree(t)
	if err := unix.Mkfifo(filepath.Join(dir, "etc/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := root.ReadFile(context.Background(), "/etc/fifo", 1<<20)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(fifo) = %v; want ErrNotRegular", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ReadFile on a FIFO blocked")
	}
	// A FIFO as a parent directory fails as fast.
	if _, err := root.ReadFile(context.Background(), "/etc/fifo/x", 10); err == nil {
		t.Error("read through a FIFO parent succeeded")
	}
}

func TestReadFileStaysInTreeAndRefusesSpecialFiles(t *testing.T) {
	root, dir, host := tree(t)
	// Symlinks resolve as inside the sandbox: an absolute or climbing one
	// to the host file lands on <tree>/host-secret, which does not exist.
	os.Symlink(host, filepath.Join(dir, "etc/abs"))
	os.Symlink("../../../host-secret", filepath.Join(dir, "etc/rel"))
	os.Symlink("/", filepath.Join(dir, "up"))
	os.WriteFile(filepath.Join(dir, "etc/real"), []byte("inside\n"), 0o644)
	os.Symlink("/etc/real", filepath.Join(dir, "etc/inner"))
	for _, name := range []string{"etc/abs", "etc/rel", "up/host-secret", "up/../../host-secret"} {
		if b, err := root.ReadFile(context.Background(), name, 1<<20); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ReadFile(%s) = %q, %v; want ErrNotExist (never the host file)", name, b, err)
		}
	}
	for _, name := range []string{"etc/inner", "up/etc/real", "up/../etc/real"} {
		if b, err := root.ReadFile(context.Background(), name, 1<<20); err != nil || string(b) != "inside\n" {
			t.Errorf("ReadFile(%s) = %q, %v; want the file inside", name, b, err)
		}
	}
	os.Mkdir(filepath.Join(dir, "etc/dir"), 0o755)
	if err := unix.Mknod(filepath.Join(dir, "etc/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	os.Symlink("null", filepath.Join(dir, "etc/tonull"))
	for _, name := range []string{"etc/dir", "etc/null", "etc/tonull"} {
		if b, err := root.ReadFile(context.Background(), name, 1<<20); !errors.Is(err, ErrNotRegular) {
			t.Errorf("ReadFile(%s) = %q, %v; want ErrNotRegular", name, b, err)
		}
	}
}

func TestReadFileDeadline(t *testing.T) {
	root, dir, _ := tree(t)
	os.WriteFile(filepath.Join(dir, "etc/f"), []byte("x"), 0o644)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := root.ReadFile(ctx, "etc/f", 10); !errors.Is(err, context.Canceled) {
		t.Errorf("ReadFile with a done context = %v", err)
	}
}

func TestWriteFileReplacesWithoutFollowing(t *testing.T) {
	root, dir, host := tree(t)
	os.Symlink(host, filepath.Join(dir, "etc/hosts"))
	unix.Mkfifo(filepath.Join(dir, "etc/resolv.conf"), 0o644)
	for _, name := range []string{"/etc/hosts", "/etc/resolv.conf", "/new/dir/file"} {
		done := make(chan error, 1)
		go func() { done <- root.WriteFile(context.Background(), name, []byte("generated\n"), 0o644) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("WriteFile(%s): %v", name, err)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("WriteFile(%s) blocked", name)
		}
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
			t.Errorf("%s after WriteFile: %v, %v; want a 0644 regular file", name, fi, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s owned by %d:%d", name, st.Uid, st.Gid)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, name)); string(b) != "generated\n" {
			t.Errorf("%s = %q", name, b)
		}
	}
	if b, _ := os.ReadFile(host); string(b) != "host data\n" {
		t.Errorf("host file written through a symlink: %q", b)
	}
	// A symlinked directory on the way stays inside the tree.
	os.Symlink(filepath.Dir(host), filepath.Join(dir, "escape"))
	if err := root.WriteFile(context.Background(), "escape/host-secret", []byte("x"), 0o644); err == nil {
		t.Error("wrote through a symlinked parent pointing outside")
	}
	if b, _ := os.ReadFile(host); string(b) != "host data\n" {
		t.Errorf("host file written through a symlinked parent: %q", b)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "etc"))
	for _, e := range entries {
		if e.Name() != "hosts" && e.Name() != "resolv.conf" {
			t.Errorf("left behind in etc: %s", e.Name())
		}
	}
}

func TestWriteFileRefusesDirectory(t *testing.T) {
	root, dir, _ := tree(t)
	os.MkdirAll(filepath.Join(dir, "etc/hosts/sub"), 0o755)
	if err := root.WriteFile(context.Background(), "etc/hosts", []byte("x"), 0o644); err == nil {
		t.Error("replaced a directory")
	}
	if fi, err := os.Stat(filepath.Join(dir, "etc/hosts/sub")); err != nil || !fi.IsDir() {
		t.Errorf("directory damaged: %v", err)
	}
}

func TestWriteFileUnchangedIsNotRewritten(t *testing.T) {
	root, dir, _ := tree(t)
	p := filepath.Join(dir, "etc/f")
	data := bytes.Repeat([]byte("a"), 1000)
	if err := root.WriteFile(context.Background(), "etc/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	var st1, st2 unix.Stat_t
	unix.Stat(p, &st1)
	if err := root.WriteFile(context.Background(), "etc/f", data, 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Stat(p, &st2)
	if st1.Ino != st2.Ino {
		t.Error("identical content was rewritten")
	}
	if err := root.WriteFile(context.Background(), "etc/f", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode change not applied: %v", fi.Mode())
	}
}

func TestInspectFollowsNoSymlink(t *testing.T) {
	root, dir, host := tree(t)
	os.Symlink(filepath.Dir(host), filepath.Join(dir, "out"))
	os.Symlink("etc", filepath.Join(dir, "in"))
	os.WriteFile(filepath.Join(dir, "etc/f"), []byte("x"), 0o644)
	unix.Mkfifo(filepath.Join(dir, "etc/fifo"), 0o644)
	if st, err := root.Lstat("out"); err != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		t.Errorf("Lstat(out) = %o, %v; want the symlink itself", st.Mode, err)
	}
	for _, name := range []string{"out/host-secret", "in/f"} {
		if _, err := root.Lstat(name); !errors.Is(err, unix.ELOOP) {
			t.Errorf("Lstat(%s) = %v; want ELOOP (a symlink on the way)", name, err)
		}
		if _, err := root.OpenEntry(name); err == nil {
			t.Errorf("OpenEntry(%s) followed a symlink", name)
		}
	}
	for _, name := range []string{"out", "in"} {
		if ents, err := root.ReadDir(name); err == nil {
			t.Errorf("ReadDir(%s) = %v; followed a symlink", name, ents)
		}
	}
	if target, err := root.Readlink("out"); err != nil || target != filepath.Dir(host) {
		t.Errorf("Readlink(out) = %q, %v", target, err)
	}
	for _, name := range []string{"out", "etc/fifo"} {
		if _, err := root.OpenEntry(name); !errors.Is(err, ErrNotRegular) {
			t.Errorf("OpenEntry(%s) = %v; want ErrNotRegular", name, err)
		}
	}
	if f, err := root.OpenEntry("etc/f"); err != nil {
		t.Errorf("OpenEntry(etc/f): %v", err)
	} else {
		f.Close()
	}
	if _, err := root.DirXattr("etc/f", "user.x", make([]byte, 8)); !errors.Is(err, unix.ENOTDIR) {
		t.Errorf("DirXattr(file) = %v; want ENOTDIR", err)
	}
}

func TestReadEntryIsCappedAndFollowsNoSymlink(t *testing.T) {
	root, dir, host := tree(t)
	os.WriteFile(filepath.Join(dir, "etc/f"), []byte("12345"), 0o644)
	os.Symlink(host, filepath.Join(dir, "etc/link"))
	ctx := context.Background()
	if b, err := root.ReadEntry(ctx, "/etc/f", 5); err != nil || string(b) != "12345" {
		t.Fatalf("ReadEntry at cap = %q, %v", b, err)
	}
	if _, err := root.ReadEntry(ctx, "etc/f", 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ReadEntry over cap = %v; want ErrTooLarge", err)
	}
	if b, err := root.ReadEntry(ctx, "etc/link", 1<<20); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("ReadEntry(symlink) = %q, %v; want ErrNotRegular", b, err)
	}
}

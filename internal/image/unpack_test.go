package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

func requireRoot(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t, "mknod, chown, trusted xattrs, overlay mounts")
}

// unpackEntries unpacks entries into a fresh directory and returns it.
func unpackEntries(t *testing.T, entries ...imagetest.Entry) (string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layer")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data := imagetest.TarBytes(t, entries...)
	return dir, unpackLayer(context.Background(), bytes.NewReader(data), dir, func(int64) error { return nil }, slog.New(slog.DiscardHandler))
}

func lstat(t *testing.T, p string) *unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return &st
}

func TestUnpackPreservesMetadata(t *testing.T) {
	requireRoot(t)
	mtime := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	suid := imagetest.File("bin/suid", 0o4755, "#!/bin/sh\n")
	suid.Uid, suid.Gid, suid.ModTime = 123, 456, mtime
	sticky := imagetest.Dir("scratch/", 0o1777)
	sticky.ModTime = mtime
	xattr := imagetest.File("etc/xattr", 0o640, "x")
	xattr.PAXRecords = map[string]string{
		"SCHILY.xattr.user.note":              "hello",
		"SCHILY.xattr.trusted.overlay.opaque": "y", // must be dropped
	}
	null := imagetest.Entry{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}}
	fifo := imagetest.Entry{Header: tar.Header{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o600}}
	link := imagetest.Symlink("bin/sh", "suid")
	link.Uid, link.Gid = 7, 8

	dir, err := unpackEntries(t,
		imagetest.Dir("bin/", 0o755), suid, link,
		imagetest.Hardlink("bin/suid-again", "bin/suid"),
		sticky, imagetest.File("scratch/child", 0o600, "c"),
		xattr, null, fifo,
	)
	if err != nil {
		t.Fatalf("unpack: %v", err)
	}

	st := lstat(t, filepath.Join(dir, "bin/suid"))
	if st.Mode&0o7777 != 0o4755 || st.Uid != 123 || st.Gid != 456 {
		t.Errorf("bin/suid: mode %o uid %d gid %d, want 4755 123 456", st.Mode&0o7777, st.Uid, st.Gid)
	}
	if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime) {
		t.Errorf("bin/suid mtime %v, want %v", got, mtime)
	}
	if st.Nlink != 2 {
		t.Errorf("bin/suid nlink %d, want 2 (hardlink)", st.Nlink)
	}
	if st2 := lstat(t, filepath.Join(dir, "bin/suid-again")); st2.Ino != st.Ino {
		t.Errorf("hardlink has inode %d, want %d", st2.Ino, st.Ino)
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "suid" {
		t.Errorf("bin/sh -> %q (%v), want suid", target, err)
	}
	if st := lstat(t, filepath.Join(dir, "bin/sh")); st.Uid != 7 || st.Gid != 8 {
		t.Errorf("symlink owner %d:%d, want 7:8", st.Uid, st.Gid)
	}
	st = lstat(t, filepath.Join(dir, "scratch"))
	if st.Mode&0o7777 != 0o1777 {
		t.Errorf("scratch mode %o, want 1777", st.Mode&0o7777)
	}
	if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime) {
		t.Errorf("scratch mtime %v, want %v (dir times set after children)", got, mtime)
	}
	st = lstat(t, filepath.Join(dir, "dev/null"))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 1 || unix.Minor(st.Rdev) != 3 || st.Mode&0o777 != 0o666 {
		t.Errorf("dev/null mode %o rdev %d:%d, want char 1:3 0666", st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	if st := lstat(t, filepath.Join(dir, "run/fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("run/fifo mode %o, want fifo", st.Mode)
	}
	buf := make([]byte, 64)
	n, err := unix.Lgetxattr(filepath.Join(dir, "etc/xattr"), "user.note", buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Errorf("user.note = %q (%v), want hello", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(dir, "etc/xattr"), opaqueXattr, buf); !errors.Is(err, unix.ENODATA) {
		t.Errorf("image-supplied %s was applied (err %v); want dropped", opaqueXattr, err)
	}
}

func TestUnpackWhiteoutsBecomeOverlayForm(t *testing.T) {
	requireRoot(t)
	dir, err := unpackEntries(t,
		imagetest.Dir("a/", 0o755),
		imagetest.Whiteout("a/gone"),
		imagetest.Opaque("o"),
		imagetest.File("o/new", 0o644, "new"),
		imagetest.File(".wh..wh.plnk", 0o644, ""), // AUFS bookkeeping: ignored
	)
	if err != nil {
		t.Fatalf("unpack: %v", err)
	}
	st := lstat(t, filepath.Join(dir, "a/gone"))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("a/gone: mode %o rdev %d, want 0/0 char device", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(dir, "o"), opaqueXattr, buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("o: %s = %q (%v), want y", opaqueXattr, buf[:n], err)
	}
	for _, p := range []string{"a/.wh.gone", "o/.wh..wh..opq", ".wh..wh.plnk", "plnk"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s exists in the unpacked layer (err %v)", p, err)
		}
	}
}

func TestUnpackRefusesTraversal(t *testing.T) {
	requireRoot(t)
	for _, tc := range []struct {
		name    string
		entries []imagetest.Entry
	}{
		{"dotdot", []imagetest.Entry{imagetest.File("../evil", 0o644, "x")}},
		{"inner dotdot", []imagetest.Entry{imagetest.File("a/../../evil", 0o644, "x")}},
		{"absolute", []imagetest.Entry{imagetest.File("/evil", 0o644, "x")}},
		{"hardlink out", []imagetest.Entry{imagetest.Hardlink("h", "../evil")}},
		{"hardlink absolute", []imagetest.Entry{imagetest.Hardlink("h", "/etc/passwd")}},
		{"whiteout dotdot", []imagetest.Entry{imagetest.File("a/.wh...", 0o644, "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := unpackEntries(t, tc.entries...)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("unpack err = %v, want ErrInvalid", err)
			}
			if _, err := os.Lstat(filepath.Join(filepath.Dir(dir), "evil")); err == nil {
				t.Fatal("entry escaped the layer dir")
			}
		})
	}
}

func TestUnpackSymlinkParentsStayInside(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	dir, err := unpackEntries(t,
		imagetest.Symlink("up", "../../../../../../.."),
		imagetest.File("up/pwned", 0o644, "inside"),
	)
	if err != nil {
		t.Fatalf("unpack: %v", err)
	}
	// up resolves to the layer root, so up/pwned lands at the root.
	if b, err := os.ReadFile(filepath.Join(dir, "pwned")); err != nil || string(b) != "inside" {
		t.Errorf("layer/pwned = %q (%v), want the file clamped inside the layer", b, err)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(dir), "pwned")); err == nil {
		t.Error("up/pwned escaped the layer")
	}

	// A file through an absolute symlink to a host dir must not reach it.
	_, err = unpackEntries(t,
		imagetest.Symlink("abs", outside),
		imagetest.File("abs/pwned", 0o644, "x"),
	)
	if _, serr := os.Lstat(filepath.Join(outside, "pwned")); serr == nil {
		t.Fatalf("abs/pwned written to the host dir %s (unpack err %v)", outside, err)
	}
}

func TestUnpackLaterEntriesReplace(t *testing.T) {
	requireRoot(t)
	dir, err := unpackEntries(t,
		imagetest.File("f", 0o644, "old"),
		imagetest.File("f", 0o600, "new"),
		imagetest.Dir("d/", 0o755),
		imagetest.File("d/x", 0o644, "x"),
		imagetest.File("d", 0o644, "now a file"),
		imagetest.Symlink("s", "f"),
		imagetest.Dir("s/", 0o700),
	)
	if err != nil {
		t.Fatalf("unpack: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "f")); string(b) != "new" {
		t.Errorf("f = %q, want new", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "d")); string(b) != "now a file" {
		t.Errorf("d = %q, want the replacing file", b)
	}
	if st := lstat(t, filepath.Join(dir, "s")); st.Mode&unix.S_IFMT != unix.S_IFDIR {
		t.Errorf("s mode %o, want the replacing directory", st.Mode)
	}
}

func TestCleanName(t *testing.T) {
	for in, want := range map[string]string{"./": ".", "./etc/": "etc", "a//b/./c": "a/b/c", "usr/bin/[": "usr/bin/["} {
		if got, err := cleanName(in); err != nil || got != want {
			t.Errorf("cleanName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/", "/etc", "..", "a/../..", "a/.."} {
		if _, err := cleanName(in); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("cleanName(%q) err = %v, want ErrInvalid", in, err)
		}
	}
}

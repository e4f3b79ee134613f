package cli

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A tree written by writeTar and read back by readTar keeps contents,
// permission bits (also of a read-only directory) and symlinks.
func TestTarRoundTripKeepsModes(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "sub", "ro"), 0o755)
	os.WriteFile(filepath.Join(src, "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "secret"), []byte{0, 0xff, 1}, 0o600)
	os.WriteFile(filepath.Join(src, "sub", "ro", "f"), []byte("x"), 0o644)
	os.Chmod(filepath.Join(src, "sub", "ro"), 0o555)
	os.Symlink("../run.sh", filepath.Join(src, "sub", "link"))
	var buf bytes.Buffer
	if err := writeTar(&buf, src); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "copy")
	if err := readTar(&buf, dst); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]fs.FileMode{"run.sh": 0o755, "sub/secret": 0o600, "sub/ro": fs.ModeDir | 0o555, "sub/ro/f": 0o644} {
		fi, err := os.Lstat(filepath.Join(dst, name))
		if err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", name, fi.Mode(), err, want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "sub", "secret")); !bytes.Equal(b, []byte{0, 0xff, 1}) {
		t.Errorf("content %x", b)
	}
	if l, err := os.Readlink(filepath.Join(dst, "sub", "link")); err != nil || l != "../run.sh" {
		t.Errorf("symlink %q %v", l, err)
	}
}

// An archive cannot place anything outside the destination, by path or
// through a symlink it planted.
func TestReadTarStaysInside(t *testing.T) {
	for _, entries := range [][]tar.Header{
		{{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/tmp"}, {Name: "l/escape", Typeflag: tar.TypeReg, Mode: 0o644}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			tw.WriteHeader(&h)
		}
		tw.Close()
		parent := t.TempDir()
		if err := readTar(&buf, filepath.Join(parent, "d")); err == nil {
			t.Errorf("%+v: unpacked, want a refusal", entries)
		}
		if _, err := os.Stat(filepath.Join(parent, "escape")); err == nil {
			t.Errorf("%+v: wrote outside the destination", entries)
		}
	}
}

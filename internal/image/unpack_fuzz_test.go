package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
)

// fuzzBudget is the byte budget each fuzzed layer is unpacked under.
const fuzzBudget = 32 << 10

var errFuzzBudget = errors.New("fuzz budget exhausted")

// FuzzUnpackLayer feeds arbitrary bytes to the layer unpacker as a tar
// stream. Whatever the archive, the unpack must not panic, must not create,
// change or remove anything outside the layer directory (a sibling
// directory and the parent's listing are checked), and must not put more
// bytes on disk than it charged to the budget.
func FuzzUnpackLayer(f *testing.F) {
	requireRoot(f)
	for _, entries := range [][]imagetest.Entry{
		{imagetest.Dir("etc/", 0o755), imagetest.File("etc/passwd", 0o644, "root:x:0:0::/root:/bin/sh\n")},
		{imagetest.File("../evil", 0o644, "x")},
		{imagetest.File("a/../../evil", 0o644, "x")},
		{imagetest.File("/evil", 0o644, "x")},
		{imagetest.Hardlink("h", "../evil")},
		{imagetest.Hardlink("h", "/etc/passwd")},
		{imagetest.File("a/.wh...", 0o644, "")},
		{imagetest.Symlink("up", "../../../../.."), imagetest.File("up/pwned", 0o644, "x")},
		{imagetest.Symlink("abs", "/tmp"), imagetest.File("abs/pwned", 0o644, "x")},
		{imagetest.Symlink("out", "../outside"), imagetest.Hardlink("out/h", "f"), imagetest.File("out/f", 0o644, "x")},
		{imagetest.File("f", 0o644, "x"), imagetest.Hardlink("g", "f"), imagetest.Symlink("f", "/etc/shadow")},
		{imagetest.Dir("d/", 0o755), imagetest.File("d/x", 0o644, "x"), imagetest.Opaque("d"), imagetest.Whiteout("d/x")},
		{{Header: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3}}},
		{{Header: tar.Header{Typeflag: tar.TypeReg, Name: "x", Mode: 0o644,
			PAXRecords: map[string]string{"SCHILY.xattr.user.a": "b", "SCHILY.xattr.trusted.overlay.opaque": "y"}}}},
	} {
		f.Add(imagetest.TarBytes(f, entries...))
	}
	f.Add(imagetest.SparseBombTar(f, 1<<30))
	f.Add(imagetest.ZerosTar(f, 2*fuzzBudget))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		dir, outside := filepath.Join(base, "layer"), filepath.Join(base, "outside")
		for _, d := range []string{dir, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(outside, "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		var charged int64
		charge := func(n int64) error {
			if charged += n; charged > fuzzBudget {
				return errFuzzBudget
			}
			return nil
		}
		_ = unpackLayer(context.Background(), bytes.NewReader(data), dir, charge, slog.New(slog.DiscardHandler))

		if names := dirNames(t, base); len(names) != 2 || names[0] != "layer" || names[1] != "outside" {
			t.Fatalf("unpack changed the layer's parent: %v", names)
		}
		if names := dirNames(t, outside); len(names) != 1 || names[0] != "f" {
			t.Fatalf("unpack wrote outside the layer: %v", names)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "f")); err != nil || string(b) != "x" {
			t.Fatalf("unpack changed a file outside the layer: %q %v", b, err)
		}
		if n := fileBytes(t, dir); n > charged {
			t.Fatalf("layer holds %d bytes but only %d were charged", n, charged)
		}
	})
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names
}

// fileBytes sums the sizes of the regular files under dir, each inode once.
func fileBytes(t *testing.T, dir string) int64 {
	t.Helper()
	seen := map[uint64]bool{}
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		n += fi.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

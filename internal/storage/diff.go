package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Change kinds reported by Diff.
const (
	Added    = "added"
	Modified = "modified"
	Deleted  = "deleted"
)

// Change is one path that differs between two root filesystems.
type Change struct {
	// Path is absolute within the root filesystem.
	Path string
	// Kind is Added, Modified or Deleted. A rename is a delete plus an add.
	Kind string
	// Size is the file's size on the side that has it (B unless deleted).
	Size int64
}

// Diff compares the merged views of two overlay layer stacks (bottom first;
// the top of each may be a live upper dir) and lists every path added,
// modified or deleted going from a to b, sorted by path.
//
// It never walks what the stacks share: the longest common prefix of
// layers is skipped, and only paths that appear in the remaining layers —
// in practice the uppers and captured layers, i.e. what sandboxes wrote —
// are looked up in both views. Where a top layer hides a lower subtree (a
// whiteout, an opaque directory, a file replacing a directory) that
// subtree is enumerated too, so deletions are exact.
//
// Two entries are the same when type, mode, owner and (for symlinks) target
// match and, for regular files, size matches and either the mtime matches
// or the contents hash equal. Directory mtimes are ignored: they change
// whenever a child does, and the child is reported.
func Diff(ctx context.Context, a, b []string) ([]Change, error) {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	cand := map[string]bool{}
	for _, top := range [][]string{a[n:], b[n:]} {
		for _, layer := range top {
			if err := collect(ctx, layer, cand, a, b); err != nil {
				return nil, err
			}
		}
	}
	paths := make([]string, 0, len(cand))
	for p := range cand {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var out []Change
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ea, err := lookup(a, p)
		if err != nil {
			return nil, err
		}
		eb, err := lookup(b, p)
		if err != nil {
			return nil, err
		}
		switch {
		case ea == nil && eb == nil:
		case ea == nil:
			out = append(out, Change{Path: "/" + p, Kind: Added, Size: eb.size()})
		case eb == nil:
			out = append(out, Change{Path: "/" + p, Kind: Deleted, Size: ea.size()})
		default:
			same, err := sameEntry(ea, eb)
			if err != nil {
				return nil, err
			}
			if !same {
				out = append(out, Change{Path: "/" + p, Kind: Modified, Size: eb.size()})
			}
		}
	}
	return out, nil
}

// collect adds every path in layer to cand. Below an entry that hides
// lower layers (whiteout, opaque dir, non-directory) it also adds every
// path of that subtree in all layers of both stacks.
func collect(ctx context.Context, layer string, cand map[string]bool, stacks ...[]string) error {
	return filepath.WalkDir(layer, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("diff: walk %s: %w", p, err)
		}
		if p == layer {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := filepath.ToSlash(p[len(layer)+1:])
		cand[rel] = true
		if d.IsDir() && !isOpaque(p) {
			return nil
		}
		for _, st := range stacks {
			for _, l := range st {
				if l == layer {
					continue
				}
				if err := addSubtree(filepath.Join(l, rel), rel, cand); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

func addSubtree(dir, rel string, cand map[string]bool) error {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		cand[rel+"/"+filepath.ToSlash(p[len(dir)+1:])] = true
		return nil
	})
}

// entry is a path as seen through a layer stack.
type entry struct {
	path string // host path of the file in the layer that provides it
	st   unix.Stat_t
}

func (e *entry) size() int64 {
	if e.st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0
	}
	return e.st.Size
}

// lookup resolves rel (slash-separated, relative) through layers the way
// overlayfs does, or returns nil when rel does not exist in the merged view.
func lookup(layers []string, rel string) (*entry, error) {
	parts := strings.Split(rel, "/")
	for i := len(layers) - 1; i >= 0; i-- {
		layer := layers[i]
		// Ancestors in this layer: a whiteout or non-directory hides rel in
		// this and every lower layer; an opaque dir hides the lower ones.
		stop := false
		for j := 1; j < len(parts); j++ {
			var st unix.Stat_t
			anc := filepath.Join(layer, filepath.Join(parts[:j]...))
			if err := unix.Lstat(anc, &st); err != nil {
				break // absent here: look in lower layers
			}
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return nil, nil
			}
			if isOpaque(anc) {
				stop = true
			}
		}
		p := filepath.Join(layer, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err == nil {
			if isWhiteout(&st) {
				return nil, nil
			}
			return &entry{path: p, st: st}, nil
		} else if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("diff: stat %s: %w", p, err)
		}
		if stop {
			return nil, nil
		}
	}
	return nil, nil
}

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(dir string) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Lgetxattr(dir, attr, buf); err == nil && n > 0 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

func sameEntry(a, b *entry) (bool, error) {
	sa, sb := &a.st, &b.st
	if sa.Mode != sb.Mode || sa.Uid != sb.Uid || sa.Gid != sb.Gid {
		return false, nil
	}
	if sa.Dev == sb.Dev && sa.Ino == sb.Ino {
		return true, nil // the same file, from a shared layer
	}
	switch sa.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return true, nil
	case unix.S_IFLNK:
		ta, err1 := os.Readlink(a.path)
		tb, err2 := os.Readlink(b.path)
		if err := errors.Join(err1, err2); err != nil {
			return false, fmt.Errorf("diff: %w", err)
		}
		return ta == tb, nil
	case unix.S_IFREG:
		if sa.Size != sb.Size {
			return false, nil
		}
		if sa.Mtim == sb.Mtim {
			return true, nil
		}
		return sameContent(a.path, b.path)
	default:
		return sa.Rdev == sb.Rdev, nil
	}
}

func sameContent(a, b string) (bool, error) {
	ha, err := hashFile(a)
	if err != nil {
		return false, err
	}
	hb, err := hashFile(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ha, hb), nil
}

func hashFile(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("diff: read %s: %w", p, err)
	}
	return h.Sum(nil), nil
}

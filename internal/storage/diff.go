package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandboxfs"
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

// maxDiffPaths bounds the paths one Diff considers, and so the memory a
// sandbox can make the daemon spend by creating files.
const maxDiffPaths = 1 << 19

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
//
// Layers are what sandboxes wrote, and a live upper changes while Diff
// reads it, so every access goes through sandboxfs without following a
// single symlink: nothing a sandbox plants or swaps in leads Diff out of
// its layers or onto a FIFO, and more than maxDiffPaths paths is an error.
func Diff(ctx context.Context, a, b []string) ([]Change, error) {
	ls, err := openLayers(a, b)
	if err != nil {
		return nil, err
	}
	defer ls.close()
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	cand := candidates{}
	for _, top := range [][]string{a[n:], b[n:]} {
		for _, layer := range top {
			if err := ls.collect(ctx, layer, cand, a, b); err != nil {
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
		ea, err := ls.lookup(a, p)
		if err != nil {
			return nil, err
		}
		eb, err := ls.lookup(b, p)
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
			same, err := sameEntry(ctx, ea, eb)
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

// candidates are the paths (relative, slash-separated) Diff looks up.
type candidates map[string]bool

func (c candidates) add(p string) error {
	if len(c) >= maxDiffPaths && !c[p] {
		return fmt.Errorf("diff: more than %d changed paths: %w", maxDiffPaths, errdefs.ErrInvalid)
	}
	c[p] = true
	return nil
}

// layers holds every layer of a Diff open; a missing layer is nil (empty).
type layers map[string]*sandboxfs.Tree

func openLayers(stacks ...[]string) (layers, error) {
	ls := layers{}
	for _, st := range stacks {
		for _, l := range st {
			if _, ok := ls[l]; ok {
				continue
			}
			t, err := sandboxfs.OpenTree(l)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				ls.close()
				return nil, fmt.Errorf("diff: %w", err)
			}
			ls[l] = t
		}
	}
	return ls, nil
}

func (ls layers) close() {
	for _, t := range ls {
		if t != nil {
			t.Close()
		}
	}
}

// collect adds every path in layer to cand. Below an entry that hides
// lower layers (whiteout, opaque dir, non-directory) it also adds every
// path of that subtree in all layers of both stacks.
func (ls layers) collect(ctx context.Context, layer string, cand candidates, stacks ...[]string) error {
	t := ls[layer]
	if t == nil {
		return nil
	}
	return walk(ctx, t, ".", func(rel string, st *unix.Stat_t) error {
		if err := cand.add(rel); err != nil {
			return err
		}
		if isDir(st) && !isOpaque(t, rel) {
			return nil
		}
		for _, s := range stacks {
			for _, l := range s {
				if l == layer || ls[l] == nil {
					continue
				}
				if err := addSubtree(ctx, ls[l], rel, cand); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// walk calls fn for every entry below dir in t, parents first. Entries
// that vanish or turn into something else while it walks are skipped.
func walk(ctx context.Context, t *sandboxfs.Tree, dir string, fn func(rel string, st *unix.Stat_t) error) error {
	ents, err := t.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return err
		}
		rel := path.Join(dir, e.Name())
		st, err := t.Lstat(rel)
		if err != nil {
			continue
		}
		if err := fn(rel, &st); err != nil {
			return err
		}
		if isDir(&st) {
			if err := walk(ctx, t, rel, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

func addSubtree(ctx context.Context, t *sandboxfs.Tree, rel string, cand candidates) error {
	if st, err := t.Lstat(rel); err != nil || !isDir(&st) {
		return nil
	}
	return walk(ctx, t, rel, func(p string, _ *unix.Stat_t) error { return cand.add(p) })
}

// entry is a path as seen through a layer stack.
type entry struct {
	tree *sandboxfs.Tree // the layer that provides it
	rel  string
	st   unix.Stat_t
}

func (e *entry) size() int64 {
	if isDir(&e.st) {
		return 0
	}
	return e.st.Size
}

// lookup resolves rel (slash-separated, relative) through stack the way
// overlayfs does, or returns nil when rel does not exist in the merged view.
func (ls layers) lookup(stack []string, rel string) (*entry, error) {
	parts := strings.Split(rel, "/")
	for i := len(stack) - 1; i >= 0; i-- {
		t := ls[stack[i]]
		if t == nil {
			continue
		}
		// Ancestors in this layer: a whiteout or non-directory hides rel in
		// this and every lower layer; an opaque dir hides the lower ones.
		stop := false
		for j := 1; j < len(parts); j++ {
			anc := strings.Join(parts[:j], "/")
			st, err := t.Lstat(anc)
			if err != nil {
				break // absent here: look in lower layers
			}
			if !isDir(&st) {
				return nil, nil
			}
			if isOpaque(t, anc) {
				stop = true
			}
		}
		st, err := t.Lstat(rel)
		if err == nil {
			if isWhiteout(&st) {
				return nil, nil
			}
			return &entry{tree: t, rel: rel, st: st}, nil
		} else if !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENOTDIR) && !errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("diff: %w", err)
		}
		if stop {
			return nil, nil
		}
	}
	return nil, nil
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }

func isWhiteout(st *unix.Stat_t) bool {
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(t *sandboxfs.Tree, dir string) bool {
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := t.DirXattr(dir, attr, buf); err == nil && n > 0 && buf[0] == 'y' {
			return true
		}
	}
	return false
}

func sameEntry(ctx context.Context, a, b *entry) (bool, error) {
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
		ta, err1 := a.tree.Readlink(a.rel)
		tb, err2 := b.tree.Readlink(b.rel)
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
		return sameContent(ctx, a, b)
	default:
		return sa.Rdev == sb.Rdev, nil
	}
}

func sameContent(ctx context.Context, a, b *entry) (bool, error) {
	ha, err := hashEntry(ctx, a)
	if err != nil {
		return false, err
	}
	hb, err := hashEntry(ctx, b)
	if err != nil {
		return false, err
	}
	return ha != nil && hb != nil && bytes.Equal(ha, hb), nil
}

// hashEntry is the SHA-256 of regular file e, or nil when it is no longer
// one (a sandbox swapped it while Diff ran: it changed).
func hashEntry(ctx context.Context, e *entry) ([]byte, error) {
	f, err := e.tree.OpenEntry(e.rel)
	if errors.Is(err, sandboxfs.ErrNotRegular) || errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ELOOP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("diff: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			return h.Sum(nil), nil
		}
		if err != nil {
			return nil, fmt.Errorf("diff: read %s: %w", e.rel, err)
		}
	}
}

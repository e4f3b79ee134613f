package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/sandboxfs"
)

// FileChange is one path a Tracker scan found changed, as the sandbox sees
// it (its merged root filesystem).
type FileChange struct {
	// Path is absolute within the sandbox.
	Path string
	// Kind is Added, Modified or Deleted. A rename is a delete plus an add.
	Kind string
	// Size and Mode are the path's now (zero for Deleted).
	Size int64
	Mode fs.FileMode
	// SizeBefore and ModeBefore are the path's before (Modified, Deleted).
	SizeBefore int64
	ModeBefore fs.FileMode
}

// maxScanPathBytes bounds the path bytes one Scan may hold as candidates:
// a command that changes more (40,000 files with 4 KB paths would be 160
// MB) is not listed; the scan rebuilds the index instead and says so
// (ErrTooManyChanges), so what a sandbox does never grows the daemon's
// memory past this.
const maxScanPathBytes = 4 << 20

// ErrTooManyChanges is a Scan whose changes were too many to list; the
// index is rebuilt, so the next Scan reports what changes after it.
var ErrTooManyChanges = errors.New("too many changes to list")

// maxTrackedPaths bounds a Tracker's index, and so the memory a sandbox
// can make the daemon spend by creating files.
const maxTrackedPaths = 1 << 19

// Tracker follows what one sandbox changes in its filesystem, scan after
// scan, computed from its upper dir alone (never from anything the
// sandbox reports).
//
// It keeps an index of the upper dir (every path's type, mode, size,
// mtime, inode; directories' entries). On btrfs a scan asks the kernel
// which inodes of the upper's subvolume changed since the last scan's
// transaction (tree blocks newer than it: the cost follows what changed),
// resolves them to paths, and compares those paths, and the entries of
// the changed directories, against the index: names gone from a changed
// directory are deletions, new names additions; whiteouts (0/0 char
// devices) are deletions of lower files and opaque directories hide the
// lower entries below them. A path new to the upper is added unless the
// lower layers have it (a copy-up: modified, or nothing when only copied).
// Elsewhere (the copy backend) every path of the upper is a candidate:
// correct, but a scan costs a walk of the upper.
//
// Limits: the index is built by a walk of the upper when the Tracker is
// made; past maxTrackedPaths entries it stops growing and says so
// (Incomplete): deletions of paths it does not hold go unseen, and such
// paths are reported as added again whenever a scan meets them. Changes are attributed to
// the scan that first sees them: writes racing a scan may land in the
// next one. A hard link's other names are only seen when their directory
// changes. Not safe for concurrent use.
type Tracker struct {
	upper  string
	lowers []string // bottom first
	// vol is the btrfs subvolume holding upper ("" when it is not one)
	// and prefix the upper's path inside it with a trailing slash.
	vol, prefix string
	gen         uint64 // last transaction scanned (btrfs; 0 before the first scan)
	root        *node
	nodes       int
	limit       int  // index size bound (maxTrackedPaths)
	full        bool // the index hit limit
}

// node is one indexed path of the upper.
type node struct {
	mode   uint32 // st_mode
	size   int64
	ino    uint64
	mtime  unix.Timespec
	opaque bool
	kids   map[string]*node // directories only
}

func (n *node) dir() bool { return n.mode&unix.S_IFMT == unix.S_IFDIR }

// NewTracker indexes the upper dir upper (stacked over lowers, bottom
// first) as it is now: the first Scan reports what changes after.
func NewTracker(ctx context.Context, upper string, lowers []string) (*Tracker, error) {
	t := &Tracker{upper: upper, lowers: lowers, limit: maxTrackedPaths, root: &node{mode: unix.S_IFDIR, kids: map[string]*node{}}}
	if vol := filepath.Dir(upper); isSubvolume(vol) {
		// No commit here (it would cost a sandbox's first command a
		// transaction commit): with gen 0 the first scan considers every
		// inode of the subvolume, and compares each against the index,
		// so what the index already holds unchanged is not reported.
		t.vol, t.prefix = vol, filepath.Base(upper)+"/"
	}
	tree, err := sandboxfs.OpenTree(upper)
	if err != nil {
		return nil, fmt.Errorf("track %s: %w", upper, err)
	}
	defer tree.Close()
	err = walk(ctx, tree, ".", func(rel string, st *unix.Stat_t) error {
		t.set(rel, t.nodeOf(tree, rel, st))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("track %s: %w", upper, err)
	}
	return t, nil
}

// Tracks reports whether the upper held rel at the last scan (or when
// the Tracker was made), as far as the index knows.
func (t *Tracker) Tracks(rel string) bool { return t.find(clean(rel)) != nil }

// Incomplete reports whether the index is full: deletions of paths it does
// not hold go unseen.
func (t *Tracker) Incomplete() bool { return t.full }

func (t *Tracker) withVol(fn func(fd int) error) error {
	fd, err := unix.Open(t.vol, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", t.vol, err)
	}
	defer unix.Close(fd)
	return fn(fd)
}

// Scan returns what changed since the Tracker was made or last scanned,
// sorted by path, and moves the index on.
func (t *Tracker) Scan(ctx context.Context) ([]FileChange, error) {
	tree, err := sandboxfs.OpenTree(t.upper)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // reset or deleted: nothing to say
	}
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", t.upper, err)
	}
	defer tree.Close()
	s := &scan{t: t, tree: tree, cand: map[string]bool{}, done: map[string]bool{}, out: map[string]*FileChange{}}
	defer s.close()
	var dirs []string
	if t.vol != "" {
		dirs, err = t.changedPaths(s.cand)
	} else {
		dirs = []string{"."}
		held := 0
		err = walk(ctx, tree, ".", func(rel string, st *unix.Stat_t) error {
			if held += len(rel); held > maxScanPathBytes {
				return ErrTooManyChanges
			}
			s.cand[rel] = true
			if isDir(st) {
				dirs = append(dirs, rel)
			}
			return nil
		})
	}
	if errors.Is(err, ErrTooManyChanges) {
		s.cand, dirs = nil, nil // release them before the walk
		if err := t.reindex(ctx, tree); err != nil {
			return nil, fmt.Errorf("scan %s: %w", t.upper, err)
		}
		return nil, ErrTooManyChanges
	}
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", t.upper, err)
	}
	sort.Strings(dirs)
	for _, d := range dirs {
		s.listing(d)
	}
	paths := make([]string, 0, len(s.cand))
	for p := range s.cand {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := s.visit(ctx, p); err != nil {
			return nil, fmt.Errorf("scan %s: %w", t.upper, err)
		}
	}
	out := make([]FileChange, 0, len(s.out))
	for _, c := range s.out {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// changedPaths commits, adds the upper-relative paths of every inode
// changed since the last scan to cand, and returns those of directories.
func (t *Tracker) changedPaths(cand map[string]bool) ([]string, error) {
	var dirs []string
	held := 0 // path bytes in cand (maxScanPathBytes)
	err := t.withVol(func(fd int) error {
		gen, err := btrfsCommit(fd)
		if err != nil || gen <= t.gen {
			return err // nothing committed since: nothing changed
		}
		inodes, err := btrfsChangedInodes(fd, t.gen, gen)
		if err != nil {
			return err
		}
		t.gen = gen
		parents := map[uint64]string{}
		parentPath := func(ino uint64) (string, error) {
			if p, ok := parents[ino]; ok {
				return p, nil
			}
			p, err := btrfsInoPath(fd, ino)
			if err == nil {
				parents[ino] = p
			}
			return p, err
		}
		for _, in := range inodes {
			var names []string
			for _, r := range in.refs {
				pp, err := parentPath(r.parent)
				if err != nil {
					continue // gone since
				}
				names = append(names, pp+r.name)
			}
			if len(in.refs) == 0 {
				if p, err := btrfsInoPath(fd, in.ino); err == nil {
					names = append(names, strings.TrimSuffix(p, "/"))
				}
			}
			for _, n := range names {
				rel, ok := t.relOf(n)
				if !ok {
					continue // the overlay's work dir
				}
				if held += len(rel); held > maxScanPathBytes {
					return ErrTooManyChanges
				}
				cand[rel] = true
				if in.mode&unix.S_IFMT == unix.S_IFDIR {
					dirs = append(dirs, rel)
				}
			}
		}
		return nil
	})
	return dirs, err
}

// relOf turns a path inside the subvolume into one inside the upper.
func (t *Tracker) relOf(p string) (string, bool) {
	if p+"/" == t.prefix {
		return ".", true
	}
	rel, ok := strings.CutPrefix(p, t.prefix)
	return rel, ok && rel != ""
}

// nodeOf is the index entry of rel, stat st, in tree.
func (t *Tracker) nodeOf(tree *sandboxfs.Tree, rel string, st *unix.Stat_t) *node {
	n := &node{mode: st.Mode, size: st.Size, ino: st.Ino, mtime: st.Mtim}
	if isDir(st) {
		n.opaque = isOpaque(tree, rel)
		n.size = 0
	}
	if isWhiteout(st) {
		n.size = -1 // marks a whiteout: rdev is not kept
	}
	return n
}

func isWhiteoutNode(n *node) bool { return n.mode&unix.S_IFMT == unix.S_IFCHR && n.size == -1 }

// find returns rel's index entry, or nil.
func (t *Tracker) find(rel string) *node {
	n := t.root
	if rel == "." {
		return n
	}
	for _, part := range strings.Split(rel, "/") {
		if n = n.kids[part]; n == nil {
			return nil
		}
	}
	return n
}

// set makes n rel's index entry (keeping its entries when both are
// directories), creating missing parents.
func (t *Tracker) set(rel string, n *node) {
	if rel == "." {
		return
	}
	parts := strings.Split(rel, "/")
	p := t.root
	for _, part := range parts[:len(parts)-1] {
		k := p.kids[part]
		if k == nil || k.kids == nil {
			k = &node{mode: unix.S_IFDIR, kids: map[string]*node{}}
			if !t.add(p, part, k) {
				return
			}
		}
		p = k
	}
	name := parts[len(parts)-1]
	old := p.kids[name]
	if n.dir() {
		n.kids = map[string]*node{}
		if old != nil && old.kids != nil {
			n.kids = old.kids // the same entries: the count stands
		}
	}
	if old == nil {
		t.add(p, name, n)
		return
	}
	if old.kids != nil && !n.dir() {
		t.nodes -= count(old) - 1 // its entries went with it
	}
	p.kids[name] = n
}

// add puts k under p as name unless the index is full.
func (t *Tracker) add(p *node, name string, k *node) bool {
	if t.nodes >= t.limit {
		t.full = true
		return false
	}
	t.nodes++
	// A copy: name is a piece of a whole path, which would stay in memory
	// with it (40,000 files under a 4 KB directory path are 160 MB).
	p.kids[strings.Clone(name)] = k
	return true
}

// count is the entries n stands for in the index: itself and below.
func count(n *node) int {
	c := 1
	for _, k := range n.kids {
		c += count(k)
	}
	return c
}

// scan is one Scan's state.
type scan struct {
	t     *Tracker
	tree  *sandboxfs.Tree
	lower layers // opened on first use
	cand  map[string]bool
	done  map[string]bool
	out   map[string]*FileChange
}

func (s *scan) close() {
	if s.lower != nil {
		s.lower.close()
	}
}

// lowerEntry is rel in the merged view of the lower layers, or nil.
func (s *scan) lowerEntry(rel string) (*entry, error) {
	if len(s.t.lowers) == 0 {
		return nil, nil
	}
	if s.lower == nil {
		ls, err := openLayers(s.t.lowers)
		if err != nil {
			return nil, err
		}
		s.lower = ls
	}
	return s.lower.lookup(s.t.lowers, rel)
}

// listing compares changed directory d's entries with the index: names
// gone are deleted, new names become candidates.
func (s *scan) listing(d string) {
	n := s.t.find(d)
	if n == nil || !n.dir() {
		return // new here: visit walks it
	}
	ents, err := s.tree.ReadDir(d)
	if err != nil {
		return // gone: its parent's listing says so
	}
	now := make(map[string]bool, len(ents))
	for _, e := range ents {
		now[e.Name()] = true
		if n.kids[e.Name()] == nil {
			s.cand[path.Join(d, e.Name())] = true
		}
	}
	for name, k := range n.kids {
		if !now[name] {
			s.gone(path.Join(d, name), k)
			s.t.nodes -= count(k)
			delete(n.kids, name)
		}
	}
}

// gone records rel (index entry old, nil for a lower-only path) and
// everything below it, in the index and in the lower layers, as deleted
// unless the upper has it now.
func (s *scan) gone(rel string, old *node) {
	if old != nil && isWhiteoutNode(old) {
		return // deleted already
	}
	if old != nil {
		s.deleted(rel, old.size, old.mode)
		for name, k := range old.kids {
			s.gone(path.Join(rel, name), k)
		}
	}
	le, err := s.lowerEntry(rel)
	if err != nil || le == nil {
		return
	}
	if old == nil {
		s.deleted(rel, le.size(), le.st.Mode)
	}
	if isDir(&le.st) {
		s.goneBelowLower(rel, old)
	}
}

// goneBelowLower records the lower layers' entries below dir as deleted,
// except those the index (old's entries) already accounted for and those
// the upper has now.
func (s *scan) goneBelowLower(dir string, old *node) {
	seen := map[string]bool{}
	for _, l := range s.t.lowers {
		lt := s.lower[l]
		if lt == nil {
			continue
		}
		addSubtree(context.Background(), lt, dir, candidates(seen)) // capped at maxDiffPaths
	}
	for p := range seen {
		if old != nil && s.t.find(p) != nil {
			continue
		}
		if st, err := s.tree.Lstat(p); err == nil && !isWhiteout(&st) {
			continue // the upper has it: visited as such
		}
		if le, err := s.lowerEntry(p); err == nil && le != nil {
			s.deleted(p, le.size(), le.st.Mode)
		}
	}
}

func (s *scan) deleted(rel string, size int64, mode uint32) {
	if size < 0 {
		size = 0
	}
	s.out[rel] = &FileChange{Path: "/" + rel, Kind: Deleted, SizeBefore: size, ModeBefore: fileMode(mode)}
}

// visit classifies candidate rel against the index and the lower layers
// and records it in the index.
func (s *scan) visit(ctx context.Context, rel string) error {
	if s.done[rel] || rel == "." {
		return nil
	}
	s.done[rel] = true
	st, err := s.tree.Lstat(rel)
	if err != nil {
		return nil // gone again: its parent's listing says so
	}
	now := s.t.nodeOf(s.tree, rel, &st)
	old := s.t.find(rel)
	switch {
	case isWhiteoutNode(now):
		if old == nil || !isWhiteoutNode(old) {
			s.gone(rel, old)
		}
	case old == nil || isWhiteoutNode(old):
		var le *entry
		if old == nil {
			if le, err = s.lowerEntry(rel); err != nil {
				return err
			}
		}
		switch {
		case le == nil:
			s.record(rel, Added, now, 0, 0)
		case isDir(&le.st) != now.dir() || le.st.Mode != now.mode ||
			!now.dir() && (le.st.Size != now.size || le.st.Mtim != now.mtime):
			s.record(rel, Modified, now, le.size(), le.st.Mode)
		}
		if now.opaque && le != nil && isDir(&le.st) {
			s.goneBelowLower(rel, nil)
		}
		if now.dir() && (old == nil || !old.dir()) {
			s.t.set(rel, now)
			return walk(ctx, s.tree, rel, func(p string, _ *unix.Stat_t) error { return s.visit(ctx, p) })
		}
	default:
		if old.dir() && !now.dir() {
			for name, k := range old.kids {
				s.gone(path.Join(rel, name), k)
			}
		}
		if now.opaque && !old.opaque {
			s.goneBelowLower(rel, old)
		}
		if old.mode != now.mode || !now.dir() && (old.ino != now.ino || old.size != now.size || old.mtime != now.mtime) {
			s.record(rel, Modified, now, old.size, old.mode)
		}
	}
	s.t.set(rel, now)
	return nil
}

func (s *scan) record(rel, kind string, now *node, sizeBefore int64, modeBefore uint32) {
	c := &FileChange{Path: "/" + rel, Kind: kind, Size: now.size, Mode: fileMode(now.mode)}
	if kind == Modified {
		c.SizeBefore, c.ModeBefore = max(sizeBefore, 0), fileMode(modeBefore)
	}
	s.out[rel] = c
}

// fileMode converts st_mode to an fs.FileMode (type and permission bits).
func fileMode(m uint32) fs.FileMode {
	fm := fs.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		fm |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= fs.ModeSticky
	}
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		fm |= fs.ModeDir
	case unix.S_IFLNK:
		fm |= fs.ModeSymlink
	case unix.S_IFIFO:
		fm |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		fm |= fs.ModeSocket
	case unix.S_IFCHR:
		fm |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		fm |= fs.ModeDevice
	}
	return fm
}

// clean turns a sandbox path into one relative to the upper.
func clean(p string) string {
	if rel := path.Clean("/" + p)[1:]; rel != "" {
		return rel
	}
	return "."
}

// ReadLayered returns the contents of regular file name as the merged
// view of stack (layer dirs, bottom first) shows it, at most max bytes;
// a path the view does not have fails with fs.ErrNotExist. No symlink is
// followed (sandboxfs.ReadEntry).
func ReadLayered(ctx context.Context, stack []string, name string, max int64) ([]byte, error) {
	ls, err := openLayers(stack)
	if err != nil {
		return nil, err
	}
	defer ls.close()
	rel := clean(name)
	e, err := ls.lookup(stack, rel)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: fs.ErrNotExist}
	}
	return e.tree.ReadEntry(ctx, rel, max)
}

// reindex replaces the index with the upper as it is now.
func (t *Tracker) reindex(ctx context.Context, tree *sandboxfs.Tree) error {
	t.root, t.nodes, t.full = &node{mode: unix.S_IFDIR, kids: map[string]*node{}}, 0, false
	return walk(ctx, tree, ".", func(rel string, st *unix.Stat_t) error {
		t.set(rel, t.nodeOf(tree, rel, st))
		return nil
	})
}

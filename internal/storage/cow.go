package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/sandboxfs"
)

// Backends of a CoW store, as reported by CoW.Backend.
const (
	// BackendBtrfs: the data dir itself is on btrfs; volumes are subvolumes.
	BackendBtrfs = "btrfs"
	// BackendBtrfsLoop: a btrfs filesystem in <data-dir>/store.btrfs,
	// loop-mounted at <data-dir>/cow; volumes are subvolumes.
	BackendBtrfsLoop = "btrfs-loop"
	// BackendCopy: plain directories; a snapshot is a full copy (reflinked
	// where the filesystem can). Used when btrfs is unavailable.
	BackendCopy = "copy"
)

// DefaultImageSize is the apparent size of a new loop image. The file is
// sparse: it costs only what is written into it.
const DefaultImageSize = 64 << 30

// CoW is the copy-on-write store that holds sandbox upper dirs and captured
// snapshot layers as volumes. On btrfs a volume is a subvolume, a snapshot
// is O(1) and shares every extent with its source until either is written;
// on the copy backend it is a directory and a snapshot is a copy.
//
// Invariant: every volume is a direct child of a directory under Root(),
// and the store never unmounts its filesystem (running sandboxes outlive
// the daemon and keep their upper dirs open).
type CoW struct {
	backend string
	root    string
	image   string // loop image file (BackendBtrfsLoop only)
	quota   bool   // qgroups enabled: exclusive bytes are exact
	log     *slog.Logger

	// Background commits keep qgroup counts fresh for readers, who never
	// sync themselves (see freshen). Guarded by commitMu.
	commitMu   sync.Mutex
	committing bool
	committed  time.Time // when the last background commit ended
	bg         sync.WaitGroup
}

// usageFreshness is how old the last commit may be before a usage read
// starts another in the background: the counts a reader gets are at most
// about this plus one commit's time old, and a store with no readers is
// never synced for them.
const usageFreshness = time.Second

type cowOptions struct {
	imageSize int64
	force     string
	log       *slog.Logger
}

// CoWOption configures OpenCoW.
type CoWOption func(*cowOptions)

// WithImageSize sets the apparent size of a newly created loop image.
func WithImageSize(n int64) CoWOption { return func(o *cowOptions) { o.imageSize = n } }

// WithBackend forces a backend instead of choosing the best available one
// (tests use it to exercise the copy fallback).
func WithBackend(b string) CoWOption { return func(o *cowOptions) { o.force = b } }

// WithCoWLogger sets the logger for backend choice and fallbacks.
func WithCoWLogger(l *slog.Logger) CoWOption { return func(o *cowOptions) { o.log = l } }

// OpenCoW opens (creating on first use) the CoW store of dataDir at
// <dataDir>/cow: btrfs when dataDir is on btrfs, else a loop-mounted btrfs
// image at <dataDir>/store.btrfs (created sparse and formatted once,
// re-mounted after a reboot), else plain copies.
func OpenCoW(ctx context.Context, dataDir string, opts ...CoWOption) (*CoW, error) {
	o := cowOptions{imageSize: DefaultImageSize, log: slog.Default()}
	for _, f := range opts {
		f(&o)
	}
	c := &CoW{root: filepath.Join(dataDir, "cow"), log: o.log}
	if err := os.MkdirAll(c.root, 0o700); err != nil {
		return nil, fmt.Errorf("create cow store %s: %w", c.root, err)
	}
	switch {
	case o.force == BackendCopy:
		c.backend = BackendCopy
	case isBtrfs(c.root) && mountedAt(c.root):
		// Our loop image, still mounted from an earlier daemon run.
		c.backend, c.image = BackendBtrfsLoop, filepath.Join(dataDir, "store.btrfs")
	case isBtrfs(dataDir):
		c.backend = BackendBtrfs
	default:
		c.image = filepath.Join(dataDir, "store.btrfs")
		if err := mountLoopImage(ctx, c.image, c.root, o.imageSize); err != nil {
			if o.force != "" {
				return nil, err
			}
			c.log.Warn("no btrfs copy-on-write store; snapshots will be full copies", "err", err)
			c.backend, c.image = BackendCopy, ""
		} else {
			c.backend = BackendBtrfsLoop
		}
	}
	if c.backend != BackendCopy {
		if _, err := btrfsCmd(ctx, "quota", "enable", c.root); err != nil {
			c.log.Warn("btrfs quotas unavailable; usage falls back to walking files", "err", err)
		} else {
			c.quota = true
		}
	}
	for _, d := range []string{volSandboxes, volSnapshots} {
		if err := os.MkdirAll(filepath.Join(c.root, d), 0o700); err != nil {
			return nil, fmt.Errorf("create cow store: %w", err)
		}
	}
	return c, nil
}

// Directories of the store that hold volumes.
const (
	volSandboxes = "sandboxes"
	volSnapshots = "snapshots"
)

// mountLoopImage formats image (creating it sparse at size) unless it
// already holds a filesystem, and loop-mounts it at dir.
func mountLoopImage(ctx context.Context, image, dir string, size int64) error {
	if !haveBtrfsTools() {
		return errors.New("btrfs-progs or the btrfs kernel module is missing")
	}
	if _, err := os.Stat(image); errors.Is(err, fs.ErrNotExist) {
		if err := createImage(ctx, image, size); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("stat %s: %w", image, err)
	}
	out, err := exec.CommandContext(ctx, "mount", "-t", "btrfs", "-o", "loop,noatime", image, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount %s at %s: %w: %s", image, dir, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func createImage(ctx context.Context, image string, size int64) error {
	tmp := image + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("size %s: %w", tmp, err)
	}
	if out, err := exec.CommandContext(ctx, "mkfs.btrfs", "-q", "-L", "cubicle", tmp).CombinedOutput(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.btrfs %s: %w: %s", tmp, err, strings.TrimSpace(string(out)))
	}
	// Renamed only once formatted, so a crash never leaves a half-made image.
	if err := os.Rename(tmp, image); err != nil {
		return fmt.Errorf("install %s: %w", image, err)
	}
	return nil
}

// Backend names the backend in use (BackendBtrfs, BackendBtrfsLoop, BackendCopy).
func (c *CoW) Backend() string { return c.backend }

// Root is the directory volumes live under.
func (c *CoW) Root() string { return c.root }

// Image is the loop image file, or "" when none is used.
func (c *CoW) Image() string { return c.image }

// btrfs reports whether volumes are subvolumes.
func (c *CoW) btrfs() bool { return c.backend != BackendCopy }

// Create makes an empty writable volume at path.
func (c *CoW) Create(ctx context.Context, path string) error {
	if c.btrfs() {
		return btrfsSubvolCreate(path)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		return fmt.Errorf("create volume %s: %w", path, err)
	}
	return nil
}

// Snapshot makes dst a copy of volume (or plain directory) src that shares
// storage with it where the backend can; read-only when readonly. src must
// not change during the call for the copy to be consistent: callers freeze
// the writer first.
func (c *CoW) Snapshot(ctx context.Context, src, dst string, readonly bool) error {
	if c.btrfs() && isSubvolume(src) {
		return btrfsSnapshot(src, dst, readonly)
	}
	// A plain directory (copy backend, or an upper dir from before the CoW
	// store existed): copy it, preserving ownership, modes, xattrs
	// (overlay's opaque markers) and device nodes (its whiteouts).
	if err := c.Create(ctx, dst); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		c.Delete(context.WithoutCancel(ctx), dst)
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Delete removes the volume at path; a missing volume is not an error.
func (c *CoW) Delete(ctx context.Context, path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if c.btrfs() && isSubvolume(path) {
		return btrfsSubvolDelete(path)
	}
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("delete volume %s: %w", path, err)
	}
	return nil
}

// ExclusiveBytes returns, for each path, the bytes stored only by that
// volume: what deleting it would free. With btrfs quotas this is the
// qgroup's exclusive count as of the last transaction commit (so data a
// branch still shares with its source costs it nothing, and a read never
// waits for anyone's writes: it asks for a commit in the background when
// the last is older than usageFreshness); otherwise it is the allocated size of the files under
// the path (du), which counts shared data once per volume.
func (c *CoW) ExclusiveBytes(ctx context.Context, paths ...string) (map[string]int64, error) {
	res := make(map[string]int64, len(paths))
	var excl map[uint64]int64
	if c.quota {
		var err error
		if excl, err = qgroupExclusive(c.root); err != nil {
			return nil, err
		}
		c.freshen()
	}
	for _, p := range paths {
		if excl != nil && isSubvolume(p) {
			if id, err := btrfsRootID(p); err == nil {
				if n, ok := excl[id]; ok {
					res[p] = n
					continue
				}
			}
		}
		n, err := diskUsage(ctx, p)
		if err != nil {
			return nil, err
		}
		res[p] = n
	}
	return res, nil
}

// diskUsage is the allocated size of the tree at path, each inode counted
// once. A missing path uses nothing. The tree is a sandbox's: it is
// walked through sandboxfs, so a symlink swapped in never leads the walk
// out of it.
func diskUsage(ctx context.Context, path string) (int64, error) {
	t, err := sandboxfs.OpenTree(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", path, err)
	}
	defer t.Close()
	var total int64
	if st, err := t.Lstat("."); err == nil {
		total += st.Blocks * 512
	}
	seen := map[uint64]bool{}
	err = walk(ctx, t, ".", func(_ string, st *unix.Stat_t) error {
		if st.Nlink > 1 && !isDir(st) {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", path, err)
	}
	return total, nil
}

// freshen starts a commit of the store in the background (writeback and
// a transaction commit, which updates qgroup counts) unless one is running
// or the last ended less than usageFreshness ago.
func (c *CoW) freshen() {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	if c.committing || time.Since(c.committed) < usageFreshness {
		return
	}
	c.committing = true
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		if fd, err := unix.Open(c.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			if err := unix.Syncfs(fd); err != nil {
				c.log.Warn("commit cow store for usage", "err", err)
			}
			unix.Close(fd)
		}
		c.commitMu.Lock()
		c.committing, c.committed = false, time.Now()
		c.commitMu.Unlock()
	}()
}

// Unmount unmounts a loop-mounted store (after any background commit).
// The daemon never calls it (running sandboxes use the store); tests and
// uninstall do.
func (c *CoW) Unmount() error {
	c.bg.Wait()
	if c.backend != BackendBtrfsLoop {
		return nil
	}
	if err := unix.Unmount(c.root, 0); err != nil {
		return fmt.Errorf("unmount cow store %s: %w", c.root, err)
	}
	return nil
}

// mountedAt reports whether dir is a mount point.
func mountedAt(dir string) bool { return mounted(dir) }

// Package storage prepares each sandbox's root filesystem and keeps its
// copy-on-write state: an overlayfs whose lower layers are the snapshot's
// shared, read-only layer directories and whose upper layer is the
// sandbox's own writable directory, kept as a volume of the CoW store
// (a btrfs subvolume) so it can be snapshotted in milliseconds.
//
// Layout, with a CoW store at <cow>:
//
//	<cow>/sandboxes/<id>/{upper,work}   one volume per sandbox
//	<cow>/snapshots/<snap>/upper        a captured snapshot's layer (read-only volume)
//	<root>/<id>/rootfs                  the merged mount point
//
// Invariants: everything a sandbox writes lands in its upper dir, so it
// survives stop/start and daemon restarts; deleting the sandbox is deleting
// that one volume. A captured layer is an overlay upper dir (with whiteouts
// and opaque markers), which overlayfs reads correctly as a lower layer; it
// is never written after capture.
package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Overlays manages per-sandbox overlay root filesystems.
type Overlays struct {
	root string
	cow  *CoW
	// guard, when set (Guard), caps volumes when the store runs low.
	guard *SpaceGuard
}

// Option configures New.
type Option func(*Overlays)

// WithCoW keeps upper dirs and captured layers on a CoW store. Without it
// upper dirs are plain directories under the storage dir and Capture copies.
func WithCoW(c *CoW) Option { return func(o *Overlays) { o.cow = c } }

// New returns an Overlays rooted at dir (created if missing).
func New(dir string, opts ...Option) (*Overlays, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create storage dir %s: %w", dir, err)
	}
	o := &Overlays{root: dir}
	for _, f := range opts {
		f(o)
	}
	if o.cow == nil {
		// A copy-backend store in the storage dir keeps one code path.
		c, err := OpenCoW(context.Background(), dir, WithBackend(BackendCopy))
		if err != nil {
			return nil, err
		}
		o.cow = c
	}
	return o, nil
}

// Backend names the CoW backend (see CoW.Backend).
func (o *Overlays) Backend() string { return o.cow.Backend() }

// CoW is the store volumes live on.
func (o *Overlays) CoW() *CoW { return o.cow }

// Dir is the sandbox's storage directory (its rootfs mount point lives in it).
func (o *Overlays) Dir(id string) string { return filepath.Join(o.root, id) }

// RootFS is the mount point of the merged root filesystem.
func (o *Overlays) RootFS(id string) string { return filepath.Join(o.Dir(id), "rootfs") }

// volume is the directory holding the sandbox's upper and work dirs: its
// CoW volume, or — for a sandbox created before the CoW store existed —
// its storage dir.
func (o *Overlays) volume(id string) string {
	legacy := o.Dir(id)
	if _, err := os.Stat(filepath.Join(legacy, "upper")); err == nil {
		return legacy
	}
	return filepath.Join(o.cow.Root(), volSandboxes, id)
}

// UpperDir is where the sandbox's writes land.
func (o *Overlays) UpperDir(id string) string { return filepath.Join(o.volume(id), "upper") }

// Prepare creates the sandbox's (empty) upper dir unless it exists and
// returns its path, so the caller can seed files before the first boot.
func (o *Overlays) Prepare(ctx context.Context, id string) (string, error) {
	vol := o.volume(id)
	if _, err := os.Stat(vol); errors.Is(err, fs.ErrNotExist) {
		if err := o.cow.Create(ctx, vol); err != nil {
			return "", fmt.Errorf("create volume of %s: %w", id, err)
		}
	}
	upper, work := filepath.Join(vol, "upper"), filepath.Join(vol, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("prepare upper of %s: %w", id, err)
		}
	}
	return upper, nil
}

// Mount mounts the sandbox's rootfs over layers (bottom first) and returns
// its path. It is idempotent: an already-mounted rootfs is returned as is.
func (o *Overlays) Mount(ctx context.Context, id string, layers []string) (string, error) {
	if len(layers) == 0 {
		return "", errors.New("mount rootfs: snapshot has no layers")
	}
	rootfs := o.RootFS(id)
	if mounted(rootfs) {
		return rootfs, nil
	}
	upper, err := o.Prepare(ctx, id)
	if err != nil {
		return "", err
	}
	work := filepath.Join(filepath.Dir(upper), "work")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return "", fmt.Errorf("mount rootfs of %s: %w", id, err)
	}
	lowers := make([]string, len(layers))
	for i, l := range layers {
		lowers[len(layers)-1-i] = l
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), upper, work)
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("mount overlay for %s: %w", id, err)
	}
	return rootfs, nil
}

// Unmount unmounts the sandbox's rootfs; not mounted is not an error.
func (o *Overlays) Unmount(ctx context.Context, id string) error {
	rootfs := o.RootFS(id)
	if !mounted(rootfs) {
		return nil
	}
	if err := unix.Unmount(rootfs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount rootfs of %s: %w", id, err)
	}
	return nil
}

// Remove unmounts and deletes everything the sandbox wrote.
func (o *Overlays) Remove(ctx context.Context, id string) error {
	if err := o.Unmount(ctx, id); err != nil {
		return err
	}
	if err := o.cow.Delete(ctx, filepath.Join(o.cow.Root(), volSandboxes, id)); err != nil {
		return fmt.Errorf("remove storage of %s: %w", id, err)
	}
	if err := os.RemoveAll(o.Dir(id)); err != nil {
		return fmt.Errorf("remove storage of %s: %w", id, err)
	}
	return nil
}

// Reset discards everything the sandbox wrote: the next Mount starts from
// an empty upper dir. The rootfs must be unmounted.
func (o *Overlays) Reset(ctx context.Context, id string) error {
	if mounted(o.RootFS(id)) {
		return fmt.Errorf("reset storage of %s: rootfs is mounted", id)
	}
	vol := o.volume(id)
	if err := o.cow.Delete(ctx, vol); err != nil {
		return fmt.Errorf("reset storage of %s: %w", id, err)
	}
	return nil
}

// CaptureLayer is the layer directory of captured snapshot snap.
func (o *Overlays) CaptureLayer(snap string) string {
	return filepath.Join(o.cow.Root(), volSnapshots, snap, "upper")
}

// Flush writes the store's dirty data back (syncfs). Called before a
// sandbox is frozen for a capture, it moves the writeback of what the
// sandbox wrote recently out of the frozen window: a btrfs snapshot must
// flush its source's dirty data first.
func (o *Overlays) Flush(ctx context.Context, id string) error {
	fd, err := unix.Open(o.volume(id), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("flush storage of %s: %w", id, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("flush storage of %s: %w", id, err)
	}
	return nil
}

// Capture takes a read-only snapshot of sandbox id's upper dir as the
// layer of snapshot snap and returns the layer's path. The sandbox must be
// frozen (or stopped) so the copy is consistent.
func (o *Overlays) Capture(ctx context.Context, id, snap string) (string, error) {
	dst := filepath.Dir(o.CaptureLayer(snap))
	if err := o.cow.Snapshot(ctx, o.volume(id), dst, true); err != nil {
		return "", fmt.Errorf("capture upper of %s: %w", id, err)
	}
	return o.CaptureLayer(snap), nil
}

// MemoryDir is where captured snapshot snap keeps its memory image, when
// it has one: next to its layer, outside the read-only subvolume.
func (o *Overlays) MemoryDir(snap string) string {
	return filepath.Join(o.cow.Root(), volSnapshots, snap+".mem")
}

// RemoveCapture deletes snapshot snap's captured layer and memory image
// (missing is fine).
func (o *Overlays) RemoveCapture(ctx context.Context, snap string) error {
	if err := os.RemoveAll(o.MemoryDir(snap)); err != nil {
		return fmt.Errorf("remove memory image of %s: %w", snap, err)
	}
	return o.cow.Delete(ctx, filepath.Dir(o.CaptureLayer(snap)))
}

// Usage is the exclusive bytes of sandboxes ids and captured snapshots
// snaps (see CoW.ExclusiveBytes), keyed by id.
func (o *Overlays) Usage(ctx context.Context, ids, snaps []string) (map[string]int64, error) {
	key := map[string]string{}
	for _, id := range ids {
		key[o.volume(id)] = id
	}
	for _, s := range snaps {
		key[filepath.Dir(o.CaptureLayer(s))] = s
	}
	return o.exclusiveBytes(ctx, key)
}

// exclusiveBytes measures the volumes at the paths of key (path → id)
// and returns their exclusive bytes by id.
func (o *Overlays) exclusiveBytes(ctx context.Context, key map[string]string) (map[string]int64, error) {
	paths := make([]string, 0, len(key))
	for p := range key {
		paths = append(paths, p)
	}
	got, err := o.cow.ExclusiveBytes(ctx, paths...)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(got))
	for p, n := range got {
		out[key[p]] = n
	}
	return out, nil
}

// mounted reports whether path is a mount point (its device differs from
// its parent's).
func mounted(path string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(path, &st) != nil || unix.Lstat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

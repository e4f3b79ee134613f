// Package storage prepares each sandbox's root filesystem: an overlayfs whose
// lower layers are the snapshot's shared, read-only layer directories and
// whose upper layer is the sandbox's own writable directory on the host.
//
// Invariant: everything a sandbox writes lands in <root>/<id>/upper, so it
// survives stop/start and daemon restarts, and deleting the sandbox is
// removing that one directory.
package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Overlays manages per-sandbox overlay root filesystems under one directory.
type Overlays struct {
	root string
}

// New returns an Overlays rooted at dir (created if missing).
func New(dir string) (*Overlays, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create storage dir %s: %w", dir, err)
	}
	return &Overlays{root: dir}, nil
}

// Dir is the sandbox's storage directory (upper, work, rootfs live in it).
func (o *Overlays) Dir(id string) string { return filepath.Join(o.root, id) }

// UpperDir is where the sandbox's writes land.
func (o *Overlays) UpperDir(id string) string { return filepath.Join(o.Dir(id), "upper") }

// RootFS is the mount point of the merged root filesystem.
func (o *Overlays) RootFS(id string) string { return filepath.Join(o.Dir(id), "rootfs") }

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
	upper, work := o.UpperDir(id), filepath.Join(o.Dir(id), "work")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("mount rootfs of %s: %w", id, err)
		}
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
	if err := os.RemoveAll(o.Dir(id)); err != nil {
		return fmt.Errorf("remove storage of %s: %w", id, err)
	}
	return nil
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

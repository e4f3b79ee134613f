package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Persistent volumes live beside sandbox volumes on the CoW store:
//
//	<cow>/volumes/<id>            one subvolume per volume, bound into sandboxes
//	<cow>/volume-snapshots/<id>   a read-only snapshot of one
//
// Invariant: a volume's subvolume is its files and nothing else (the
// sandboxes that mount it see its root), and its qgroup limit is its size,
// set before any sandbox can write to it. The space guard (guard.go)
// leaves volumes alone: they are limited by their size only.
const (
	volVolumes        = "volumes"
	volVolumeSnapshot = "volume-snapshots"
)

// VolumePath is the directory of volume id: what sandboxes mount.
func (o *Overlays) VolumePath(id string) string {
	return filepath.Join(o.cow.Root(), volVolumes, id)
}

func (o *Overlays) volumeSnapshotPath(snap string) string {
	return filepath.Join(o.cow.Root(), volVolumeSnapshot, snap)
}

// CreateVolume makes empty volume id limited to size bytes and reports
// whether the limit is enforced (btrfs with quotas; not on the copy
// backend). A failure leaves nothing behind.
func (o *Overlays) CreateVolume(ctx context.Context, id string, size int64) (enforced bool, err error) {
	path := o.VolumePath(id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("create volume %s: %w", id, err)
	}
	if err := o.cow.Create(ctx, path); err != nil {
		return false, fmt.Errorf("create volume %s: %w", id, err)
	}
	return o.limitVolume(ctx, id, size)
}

// CloneVolume makes volume id a writable copy of volume snapshot snap
// (copy-on-write on btrfs: O(1), sharing every extent until written),
// limited to size bytes of referenced data.
func (o *Overlays) CloneVolume(ctx context.Context, snap, id string, size int64) (enforced bool, err error) {
	path := o.VolumePath(id)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("clone volume %s: %w", id, err)
	}
	if err := o.cow.Snapshot(ctx, o.volumeSnapshotPath(snap), path, false); err != nil {
		return false, fmt.Errorf("clone volume snapshot %s: %w", snap, err)
	}
	return o.limitVolume(ctx, id, size)
}

// limitVolume sets volume id's qgroup limit, deleting the volume if that
// fails (it was just made: no sandbox has written to it).
func (o *Overlays) limitVolume(ctx context.Context, id string, size int64) (bool, error) {
	path := o.VolumePath(id)
	if !o.cow.btrfs() || !o.cow.quota || !isSubvolume(path) {
		return false, nil
	}
	if err := o.cow.setQgroupLimit(path, size); err != nil {
		if derr := o.cow.Delete(context.WithoutCancel(ctx), path); derr != nil {
			err = fmt.Errorf("%w (and removing it: %v)", err, derr)
		}
		return false, fmt.Errorf("limit volume %s to %d bytes: %w", id, size, err)
	}
	return true, nil
}

// SnapshotVolume takes read-only snapshot snap of volume id. Sandboxes may
// be writing to it: its dirty data is flushed first, and the snapshot is
// what a crash at that instant would have left (crash-consistent, like a
// power cut — not coordinated with the writers).
func (o *Overlays) SnapshotVolume(ctx context.Context, id, snap string) error {
	path := o.VolumePath(id)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("snapshot volume %s: %w", id, err)
	}
	err = unix.Syncfs(fd)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("flush volume %s: %w", id, err)
	}
	dst := o.volumeSnapshotPath(snap)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return fmt.Errorf("snapshot volume %s: %w", id, err)
	}
	if err := o.cow.Snapshot(ctx, path, dst, true); err != nil {
		return fmt.Errorf("snapshot volume %s: %w", id, err)
	}
	return nil
}

// RemoveVolume deletes volume id and its data; missing is not an error.
func (o *Overlays) RemoveVolume(ctx context.Context, id string) error {
	return o.cow.Delete(ctx, o.VolumePath(id))
}

// RemoveVolumeSnapshot deletes volume snapshot snap; missing is not an
// error. Volumes cloned from it keep their data.
func (o *Overlays) RemoveVolumeSnapshot(ctx context.Context, snap string) error {
	return o.cow.Delete(ctx, o.volumeSnapshotPath(snap))
}

// VolumeUsage is the exclusive bytes of volumes ids and volume snapshots
// snaps (see CoW.ExclusiveBytes), keyed by id: a fresh clone costs only
// what it has written since.
func (o *Overlays) VolumeUsage(ctx context.Context, ids, snaps []string) (map[string]int64, error) {
	key := map[string]string{}
	for _, id := range ids {
		key[o.VolumePath(id)] = id
	}
	for _, s := range snaps {
		key[o.volumeSnapshotPath(s)] = s
	}
	return o.exclusiveBytes(ctx, key)
}

// ListVolumeFiles returns the ids that hold volume files — of volume
// snapshots when snapshots — sorted, so the daemon can find those no
// record has.
func (o *Overlays) ListVolumeFiles(_ context.Context, snapshots bool) ([]string, error) {
	dir := filepath.Dir(o.VolumePath("x"))
	if snapshots {
		dir = filepath.Dir(o.volumeSnapshotPath("x"))
	}
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list volume files: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// QuarantineVolumeFiles moves the files of volume id — of volume snapshot
// id when snapshot — to <cow>/orphans/volume-<id>-<unix time>, returning
// where; nothing is deleted. A read-only subvolume refuses rename(2), so
// the move is a snapshot (O(1)) and a delete of the original.
func (o *Overlays) QuarantineVolumeFiles(ctx context.Context, snapshot bool, id string) (string, error) {
	src := o.VolumePath(id)
	if snapshot {
		src = o.volumeSnapshotPath(id)
	}
	orphans := filepath.Join(o.cow.Root(), volOrphans)
	if err := os.MkdirAll(orphans, 0o700); err != nil {
		return "", fmt.Errorf("quarantine volume %s: %w", id, err)
	}
	dst := filepath.Join(orphans, fmt.Sprintf("volume-%s-%d", id, time.Now().Unix()))
	if err := o.cow.Snapshot(ctx, src, dst, snapshot); err != nil {
		return "", fmt.Errorf("quarantine volume %s: %w", id, err)
	}
	if err := o.cow.Delete(ctx, src); err != nil {
		return "", fmt.Errorf("quarantine volume %s: %w", id, err)
	}
	return dst, nil
}

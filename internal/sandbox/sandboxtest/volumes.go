package sandboxtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// VolumePath implements sandbox.VolumeStorage: plain directories.
func (s *Storage) VolumePath(id string) string { return filepath.Join(s.Root, "volumes", id) }

func (s *Storage) volumeSnapshotPath(snap string) string {
	return filepath.Join(s.Root, "volume-snapshots", snap)
}

// CreateVolume implements sandbox.VolumeStorage; it records the size and
// enforces nothing.
func (s *Storage) CreateVolume(_ context.Context, id string, size int64) (bool, error) {
	if s.VolumeErr != nil {
		return false, s.VolumeErr
	}
	if err := os.MkdirAll(s.VolumePath(id), 0o755); err != nil {
		return false, err
	}
	s.setLimit("volume:"+id, size)
	return false, nil
}

// CloneVolume implements sandbox.VolumeStorage by copying.
func (s *Storage) CloneVolume(_ context.Context, snap, id string, size int64) (bool, error) {
	if err := os.CopyFS(s.VolumePath(id), os.DirFS(s.volumeSnapshotPath(snap))); err != nil {
		return false, fmt.Errorf("fake clone: %w", err)
	}
	s.setLimit("volume:"+id, size)
	return false, nil
}

// SnapshotVolume implements sandbox.VolumeStorage by copying.
func (s *Storage) SnapshotVolume(_ context.Context, id, snap string) error {
	if err := os.CopyFS(s.volumeSnapshotPath(snap), os.DirFS(s.VolumePath(id))); err != nil {
		return fmt.Errorf("fake volume snapshot: %w", err)
	}
	return nil
}

// RemoveVolume implements sandbox.VolumeStorage.
func (s *Storage) RemoveVolume(_ context.Context, id string) error {
	return os.RemoveAll(s.VolumePath(id))
}

// RemoveVolumeSnapshot implements sandbox.VolumeStorage.
func (s *Storage) RemoveVolumeSnapshot(_ context.Context, snap string) error {
	return os.RemoveAll(s.volumeSnapshotPath(snap))
}

// VolumeUsage implements sandbox.VolumeStorage: one byte per id.
func (s *Storage) VolumeUsage(ctx context.Context, ids, snaps []string) (map[string]int64, error) {
	return s.Usage(ctx, ids, snaps)
}

// VolumeLimitOf returns the size volume id was made with (0: none).
func (s *Storage) VolumeLimitOf(id string) int64 { return s.LimitOf("volume:" + id) }

func (s *Storage) setLimit(key string, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limits[key] = bytes
}

// ListVolumeFiles implements sandbox.VolumeStorage.
func (s *Storage) ListVolumeFiles(_ context.Context, snapshots bool) ([]string, error) {
	if snapshots {
		return s.names("volume-snapshots")
	}
	return s.names("volumes")
}

// QuarantineVolumeFiles implements sandbox.VolumeStorage: the files move
// to Root/orphans/id.
func (s *Storage) QuarantineVolumeFiles(_ context.Context, snapshot bool, id string) (string, error) {
	if snapshot {
		return s.moveAside("volume-snapshots", id)
	}
	return s.moveAside("volumes", id)
}

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
)

// volOrphans holds the volumes of sandboxes the daemon no longer knows,
// moved aside by Quarantine: kept for an operator to inspect or delete,
// never deleted by the daemon.
const volOrphans = "orphans"

// List returns the sandbox ids that hold storage here (a storage dir, a
// CoW volume, or both), sorted, so the daemon can find those of sandboxes
// it has no record of.
func (o *Overlays) List(context.Context) ([]string, error) {
	seen := map[string]bool{}
	for _, dir := range []string{o.root, filepath.Join(o.cow.Root(), volSandboxes)} {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("list storage: %w", err)
		}
		for _, e := range ents {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				seen[e.Name()] = true
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Quarantine unmounts id's rootfs and moves what it wrote (its CoW volume,
// or a pre-CoW upper dir) to <cow>/orphans/<id>-<unix time>, returning
// that path ("" when it wrote nothing); its storage dir is then removed.
// Nothing it wrote is deleted.
func (o *Overlays) Quarantine(ctx context.Context, id string) (string, error) {
	if err := o.Unmount(ctx, id); err != nil {
		return "", err
	}
	vol := o.volume(id)
	dst := ""
	if _, err := os.Lstat(vol); err == nil {
		orphans := filepath.Join(o.cow.Root(), volOrphans)
		if err := os.MkdirAll(orphans, 0o700); err != nil {
			return "", fmt.Errorf("quarantine %s: %w", id, err)
		}
		dst = filepath.Join(orphans, fmt.Sprintf("%s-%d", id, time.Now().Unix()))
		if vol == o.Dir(id) {
			// A pre-CoW sandbox: its upper dir lives in its storage dir,
			// possibly on another filesystem than the CoW store.
			dst = filepath.Join(o.root, fmt.Sprintf(".orphan-%s-%d", id, time.Now().Unix()))
		}
		if err := os.Rename(vol, dst); err != nil {
			return "", fmt.Errorf("quarantine %s: %w", id, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("quarantine %s: %w", id, err)
	}
	if err := os.RemoveAll(o.Dir(id)); err != nil {
		return dst, fmt.Errorf("quarantine %s: remove storage dir: %w", id, err)
	}
	return dst, nil
}

// ListCaptures returns the ids captured layers are kept under (a layer
// volume, a memory image, or both), sorted.
func (o *Overlays) ListCaptures(context.Context) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(o.cow.Root(), volSnapshots))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list captures: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			seen[strings.TrimSuffix(e.Name(), ".mem")] = true
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// QuarantineCapture moves capture snap's layer volume and memory image to
// <cow>/orphans/<snap>-<unix time>[.mem], returning the layer's new path.
func (o *Overlays) QuarantineCapture(ctx context.Context, snap string) (string, error) {
	orphans := filepath.Join(o.cow.Root(), volOrphans)
	if err := os.MkdirAll(orphans, 0o700); err != nil {
		return "", fmt.Errorf("quarantine capture %s: %w", snap, err)
	}
	dst := filepath.Join(orphans, fmt.Sprintf("%s-%d", snap, time.Now().Unix()))
	layer := filepath.Dir(o.CaptureLayer(snap))
	if _, err := os.Lstat(layer); err == nil {
		// A captured layer is a read-only subvolume, which rename(2)
		// refuses to move: snapshot it (O(1), sharing every extent) to
		// its new place, then drop the original.
		if err := o.cow.Snapshot(ctx, layer, dst, true); err != nil {
			return "", fmt.Errorf("quarantine capture %s: %w", snap, err)
		}
		if err := o.cow.Delete(ctx, layer); err != nil {
			return "", fmt.Errorf("quarantine capture %s: %w", snap, err)
		}
	}
	if err := os.Rename(o.MemoryDir(snap), dst+".mem"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("quarantine capture %s: %w", snap, err)
	}
	return dst, nil
}

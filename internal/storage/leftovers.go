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

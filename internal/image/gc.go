package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// GCResult says what one GC freed.
type GCResult struct {
	Images int   // image records no workspace named any more
	Layers int   // layer directories no image and no snapshot used
	Bytes  int64 // the freed layers' unpacked size
}

// GC deletes image records that no workspace names, the manifests and
// configs only they used, and layer directories that no remaining image
// uses and that are not in inUse (absolute layer paths that snapshots, and
// so sandboxes, stack). It does not wait for running pulls: layers they
// use are pinned and left for a later GC.
func (s *Store) GC(ctx context.Context, inUse []string) (GCResult, error) {
	var res GCResult
	s.index.Lock()
	defer s.index.Unlock()

	entries, err := s.entries("")
	if err != nil {
		return res, err
	}
	named := map[string]bool{}
	for _, e := range entries {
		named[e.Digest] = true
	}
	liveBlobs := map[string]bool{}
	liveLayers := map[string]bool{}
	for _, p := range inUse {
		liveLayers[filepath.Clean(p)] = true
	}
	des, err := os.ReadDir(filepath.Join(s.root, "images"))
	if err != nil {
		return res, fmt.Errorf("gc: list images: %w", err)
	}
	var dead []*record
	for _, de := range des {
		h, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok {
			continue
		}
		rec, err := s.readRecord("sha256:" + h)
		if err != nil {
			s.log.Warn("image gc: unreadable record", "file", de.Name(), "err", err)
			continue
		}
		if !named[rec.Digest] {
			dead = append(dead, rec)
			continue
		}
		liveBlobs[rec.Digest], liveBlobs[rec.Config] = true, true
		for _, d := range rec.DiffIDs {
			if dir, err := s.layerDir(d); err == nil {
				liveLayers[dir] = true
			}
		}
	}
	for _, rec := range dead {
		if err := ctx.Err(); err != nil {
			return res, err
		}
		h, _ := hexOf(rec.Digest)
		if err := os.Remove(filepath.Join(s.root, "images", h+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("gc: remove image %s: %w", rec.Digest, err)
		}
		res.Images++
		for _, b := range []string{rec.Digest, rec.Config} {
			if bh, err := hexOf(b); err == nil && !liveBlobs[b] {
				os.Remove(filepath.Join(s.root, "blobs", "sha256", bh))
			}
		}
	}
	layers, err := os.ReadDir(filepath.Join(s.root, "layers", "sha256"))
	if err != nil {
		return res, fmt.Errorf("gc: list layers: %w", err)
	}
	for _, de := range layers {
		if !de.IsDir() {
			continue
		}
		dir := filepath.Join(s.root, "layers", "sha256", de.Name())
		if liveLayers[dir] {
			continue
		}
		size, freed, err := s.collectLayer(ctx, "sha256:"+de.Name())
		if err != nil {
			return res, err
		}
		if freed {
			res.Layers++
			res.Bytes += size
		}
	}
	if res.Images > 0 || res.Layers > 0 {
		s.log.Info("image gc", "images", res.Images, "layers", res.Layers, "bytes", res.Bytes)
	}
	return res, nil
}

// collectLayer deletes the layer diffID unless an ingest has it pinned,
// holding its unpack lock so no ingest can find it meanwhile.
func (s *Store) collectLayer(ctx context.Context, diffID string) (int64, bool, error) {
	dir, err := s.layerDir(diffID)
	if err != nil {
		return 0, false, nil // not a layer directory
	}
	unlock, err := s.lockLayer(ctx, diffID)
	if err != nil {
		return 0, false, err
	}
	defer unlock()
	if s.pinned(diffID) {
		return 0, false, nil
	}
	size, _ := s.haveLayer(dir)
	if err := s.removeLayer(dir); err != nil {
		return 0, false, err
	}
	return size, true, nil
}

// removeLayer unpublishes a layer directory with one rename (readers see
// it whole or not at all), then deletes it and its sidecar.
func (s *Store) removeLayer(dir string) error {
	tmp, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "gc-")
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.Rename(dir, filepath.Join(tmp, "layer")); err != nil {
		return fmt.Errorf("gc: unpublish layer %s: %w", filepath.Base(dir), err)
	}
	if err := os.Remove(dir + ".json"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("gc: remove layer meta %s: %w", filepath.Base(dir), err)
	}
	return nil
}

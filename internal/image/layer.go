package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sync/errgroup"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// unpackJobs bounds how many layers of one image are fetched and unpacked
// at once.
const unpackJobs = 3

// layerMeta is the sidecar next to an unpacked layer directory.
type layerMeta struct {
	Size int64 `json:"size"`
}

// source is everything ingest needs from an image. Pulls and OCI layouts
// take it straight from ggcr; docker-save archives synthesise the manifest
// (see dockerSource) so loading never recompresses layers.
type source struct {
	digest     string
	manifest   []byte
	configName string
	rawConfig  []byte
	config     *v1.ConfigFile
	layers     []v1.Layer
}

// sourceOf reads the manifest, config and layer list of img.
func sourceOf(img v1.Image) (*source, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("manifest digest: %w", err)
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("config digest: %w", err)
	}
	src, err := configAndLayers(img)
	if err != nil {
		return nil, err
	}
	src.digest, src.manifest, src.configName = digest.String(), rawManifest, cfgName.String()
	return src, nil
}

// configAndLayers reads img's config (raw and parsed) and layer list.
func configAndLayers(img v1.Image) (*source, error) {
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("parse config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	return &source{
		rawConfig: rawCfg, config: cfg, layers: layers,
	}, nil
}

// ingest makes src local: every layer unpacked, then the manifest, config,
// image record and refs written (in that order, see the package invariant).
// fromRegistry selects reading compressed blobs (so progress counts bytes
// on the wire) over ggcr's uncompressed view (cheaper for archives whose
// layers are stored uncompressed).
func (s *Store) ingest(ctx context.Context, src *source, refs []string, fromRegistry bool, progress func(Progress)) (*Image, error) {
	cfg, layers, digest := src.config, src.layers, src.digest
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return nil, fmt.Errorf("image %s: %d layers but %d diff_ids: %w", digest, len(layers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalid)
	}

	track := newTracker(progress)
	if fromRegistry && progress != nil {
		for _, l := range layers {
			if n, err := l.Size(); err == nil {
				track.total += n
			}
		}
		track.report(0)
	}

	sizes := make([]int64, len(layers))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(unpackJobs)
	for i, l := range layers {
		diffID := cfg.RootFS.DiffIDs[i].String()
		g.Go(func() error {
			n, err := s.ensureLayer(gctx, l, diffID, fromRegistry, track)
			if err != nil {
				return fmt.Errorf("unpack layer %s: %w", diffID, err)
			}
			sizes[i] = n
			return nil
		})
	}
	err := g.Wait()
	if err != nil {
		return nil, err
	}

	if src.manifest == nil {
		if digest, src.manifest, err = syntheticManifest(src, sizes); err != nil {
			return nil, fmt.Errorf("synthesise manifest: %w", err)
		}
	}
	rec := &record{Digest: digest, Config: src.configName, Run: runConfig(cfg)}
	for i, d := range cfg.RootFS.DiffIDs {
		rec.DiffIDs = append(rec.DiffIDs, d.String())
		rec.Size += sizes[i]
	}
	if err := s.putBlob(rec.Digest, src.manifest); err != nil {
		return nil, fmt.Errorf("store manifest: %w", err)
	}
	if err := s.putBlob(rec.Config, src.rawConfig); err != nil {
		return nil, fmt.Errorf("store config: %w", err)
	}
	if err := s.commit(rec, refs); err != nil {
		return nil, err
	}
	ref := ""
	if len(refs) > 0 {
		ref = refs[0]
	}
	return s.imageByDigest(ref, rec.Digest)
}

// runConfig maps the image config onto the protocol's run configuration.
// Env entries without "=" map to an empty value, as docker does.
func runConfig(cfg *v1.ConfigFile) protocol.RunConfig {
	rc := protocol.RunConfig{User: cfg.Config.User, WorkDir: cfg.Config.WorkingDir}
	for _, kv := range cfg.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" {
			continue
		}
		if rc.EnvVars == nil {
			rc.EnvVars = map[string]string{}
		}
		rc.EnvVars[k] = v
	}
	return rc
}

// tracker aggregates byte counts from concurrently unpacking layers into
// monotonic Progress callbacks.
type tracker struct {
	mu       sync.Mutex
	fn       func(Progress)
	total    int64
	complete int64
}

func newTracker(fn func(Progress)) *tracker { return &tracker{fn: fn} }

func (t *tracker) report(n int64) {
	if t == nil || t.fn == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.complete += n
	if t.complete > t.total {
		t.total = t.complete
	}
	t.fn(Progress{Total: t.total, Complete: t.complete})
}

// countingReader reports every read to a tracker and keeps a running count.
type countingReader struct {
	r     io.Reader
	n     int64
	track *tracker
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 {
		c.track.report(int64(n))
	}
	return n, err
}

// ensureLayer makes layers/sha256/<diffID> exist, unpacking l at most once
// per store no matter how many goroutines ask, and returns the layer's
// uncompressed size. The layer's bytes are checked against diffID before
// the directory is published by rename.
func (s *Store) ensureLayer(ctx context.Context, l v1.Layer, diffID string, fromRegistry bool, track *tracker) (int64, error) {
	dir, err := s.layerDir(diffID)
	if err != nil {
		return 0, err
	}
	unlock, err := s.lockLayer(ctx, diffID)
	if err != nil {
		return 0, err
	}
	defer unlock()

	if size, ok := s.haveLayer(dir); ok {
		if fromRegistry {
			if n, err := l.Size(); err == nil {
				track.report(n)
			}
		}
		return size, nil
	}

	var src io.ReadCloser
	var closeAll func(drain bool) error
	if fromRegistry {
		rc, err := l.Compressed()
		if err != nil {
			return 0, fmt.Errorf("fetch: %w", err)
		}
		cr := &countingReader{r: rc, track: track}
		src, err = decompress(cr)
		if err != nil {
			rc.Close()
			return 0, err
		}
		closeAll = func(drain bool) error {
			var derr error
			if drain {
				// Read to EOF so the registry reader verifies the blob digest.
				_, derr = io.Copy(io.Discard, cr)
			}
			src.Close()
			if cerr := rc.Close(); derr == nil {
				derr = cerr
			}
			return derr
		}
	} else {
		rc, err := l.Uncompressed()
		if err != nil {
			return 0, fmt.Errorf("open: %w", err)
		}
		src, closeAll = rc, func(bool) error { return rc.Close() }
	}

	tmp, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "layer-")
	if err != nil {
		closeAll(false)
		return 0, err
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		closeAll(false)
		return 0, err
	}

	h := sha256.New()
	ur := &countingReader{r: io.TeeReader(src, h)}
	err = unpackLayer(ctx, ur, tmp, s.log)
	if err == nil {
		// Tar padding after the end marker still counts toward the diffID.
		_, err = io.Copy(io.Discard, ur)
	}
	if cerr := closeAll(err == nil); err == nil && cerr != nil {
		err = fmt.Errorf("read blob: %w", cerr)
	}
	if err != nil {
		return 0, err
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID {
		return 0, fmt.Errorf("content is %s, want diff_id %s: %w", got, diffID, errdefs.ErrInvalid)
	}
	if err := s.writeJSON(dir+".json", layerMeta{Size: ur.n}); err != nil {
		return 0, fmt.Errorf("write layer meta: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	published = true
	s.unpacks.Add(1)
	s.log.Debug("image: unpacked layer", "diff_id", diffID, "bytes", ur.n)
	return ur.n, nil
}

// haveLayer reports whether the layer directory is published, with its
// recorded size (0 if the sidecar is unreadable).
func (s *Store) haveLayer(dir string) (int64, bool) {
	if _, err := os.Stat(dir); err != nil {
		return 0, false
	}
	var m layerMeta
	if err := readJSON(dir+".json", &m); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("image: layer size unknown", "dir", dir, "err", err)
	}
	return m.Size, true
}

var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// decompress sniffs r and returns the uncompressed stream: gzip, zstd or
// an already-uncompressed tar.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	head, err := br.Peek(4)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read blob: %w", err)
	}
	switch {
	case bytes.HasPrefix(head, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return zr, nil
	case bytes.HasPrefix(head, zstdMagic):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return zr.IOReadCloser(), nil
	default:
		return io.NopCloser(br), nil
	}
}

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
	"github.com/cubicle-dev/cubicle/internal/fault"
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

// sourceOf reads the manifest, config and layer list of img. The manifest
// was read through MaxManifestBytes by the caller's transport or file
// check; the config's declared size is checked before it is fetched.
func sourceOf(img v1.Image) (*source, error) {
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("manifest digest: %w", err)
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	if len(rawManifest) > MaxManifestBytes {
		return nil, tooBig("manifest", MaxManifestBytes)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, fmt.Errorf("parse manifest: %w: %w", errdefs.ErrInvalid, err)
	}
	if m.Config.Size > MaxConfigBytes {
		return nil, tooBig("image config", MaxConfigBytes)
	}
	src, err := configAndLayers(img)
	if err != nil {
		return nil, err
	}
	src.digest, src.manifest, src.configName = digest.String(), rawManifest, m.Config.Digest.String()
	return src, nil
}

// configAndLayers reads img's config (raw and parsed) and layer list.
// Callers have bounded the config's size already; it is checked again.
func configAndLayers(img v1.Image) (*source, error) {
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	if len(rawCfg) > MaxConfigBytes {
		return nil, tooBig("image config", MaxConfigBytes)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return nil, fmt.Errorf("parse config: %w: %w", errdefs.ErrInvalid, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	return &source{
		rawConfig: rawCfg, config: cfg, layers: layers,
	}, nil
}

// ingestTarget says where an ingested image goes and how its layers are
// read.
type ingestTarget struct {
	ws   string
	refs []string
	// private marks a pull made with credentials.
	private bool
	// fromRegistry selects reading compressed blobs (so progress counts
	// bytes on the wire) over ggcr's uncompressed view (cheaper for
	// archives whose layers are stored uncompressed).
	fromRegistry bool
}

// ingest makes src local for t.ws: every layer unpacked (or, when already
// on disk but not yet held by t.ws, verified from src), then the manifest,
// config, image record and refs written (in that order, see the package
// invariant). The unpacked bytes are charged to the store's Limits.
func (s *Store) ingest(ctx context.Context, src *source, t ingestTarget, progress func(Progress)) (*Image, error) {
	cfg, layers, digest := src.config, src.layers, src.digest
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return nil, fmt.Errorf("image %s: %d layers but %d diff_ids: %w", digest, len(layers), len(cfg.RootFS.DiffIDs), errdefs.ErrInvalid)
	}
	if len(layers) > MaxLayers {
		return nil, fmt.Errorf("image has %d layers, more than the cap of %d: %w", len(layers), MaxLayers, errdefs.ErrInvalid)
	}
	run, err := runConfig(cfg)
	if err != nil {
		return nil, err
	}
	b, err := s.newBudget()
	if err != nil {
		return nil, err
	}
	held, err := s.heldLayers(t.ws)
	if err != nil {
		return nil, err
	}

	track := newTracker(progress)
	if t.fromRegistry && progress != nil {
		for _, l := range layers {
			if n, err := l.Size(); err == nil {
				track.total += n
			}
		}
		track.report(0)
	}

	diffIDs := make([]string, len(layers))
	for i, d := range cfg.RootFS.DiffIDs {
		diffIDs[i] = d.String()
	}
	defer s.pin(diffIDs)()
	sizes := make([]int64, len(layers))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(unpackJobs)
	for i, l := range layers {
		diffID := diffIDs[i]
		g.Go(func() error {
			n, err := s.ensureLayer(gctx, layerJob{l: l, diffID: diffID, fromRegistry: t.fromRegistry, held: held[diffID], track: track, budget: b})
			if err != nil {
				return fmt.Errorf("unpack layer %s: %w", diffID, err)
			}
			sizes[i] = n
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	if src.manifest == nil {
		if digest, src.manifest, err = syntheticManifest(src, sizes); err != nil {
			return nil, fmt.Errorf("synthesise manifest: %w", err)
		}
	}
	rec := &record{Digest: digest, Config: src.configName, Run: run, DiffIDs: diffIDs}
	for _, n := range sizes {
		rec.Size += n
	}
	if err := s.putBlob(rec.Digest, src.manifest); err != nil {
		return nil, fmt.Errorf("store manifest: %w", err)
	}
	if err := s.putBlob(rec.Config, src.rawConfig); err != nil {
		return nil, fmt.Errorf("store config: %w", err)
	}
	if err := s.commit(rec, t.ws, t.refs, t.private); err != nil {
		return nil, err
	}
	ref := ""
	if len(t.refs) > 0 {
		ref = t.refs[0]
	}
	img, err := s.imageByDigest(ref, rec.Digest)
	if err != nil {
		return nil, err
	}
	return s.hold(img) // pinned again before this ingest's pins go
}

// heldLayers is the set of diffIDs of the images workspace ws holds.
func (s *Store) heldLayers(ws string) (map[string]bool, error) {
	entries, err := s.entries(ws)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range entries {
		rec, err := s.readRecord(e.Digest)
		if err != nil {
			continue // removed concurrently
		}
		for _, d := range rec.DiffIDs {
			out[d] = true
		}
	}
	return out, nil
}

// runConfig maps the image config onto the protocol's run configuration.
// Env entries without "=" map to an empty value, as docker does. A run
// config over MaxRunConfigBytes is refused: it is copied into snapshots
// and could not start a command anyway.
func runConfig(cfg *v1.ConfigFile) (protocol.RunConfig, error) {
	rc := protocol.RunConfig{User: cfg.Config.User, WorkDir: cfg.Config.WorkingDir}
	n := len(rc.User) + len(rc.WorkDir)
	for _, kv := range cfg.Config.Env {
		n += len(kv) + 1
	}
	if n > MaxRunConfigBytes {
		return rc, tooBig("the image's user, working dir and Env", MaxRunConfigBytes)
	}
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
	return rc, nil
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

// layerJob is one layer of an ingest.
type layerJob struct {
	l            v1.Layer
	diffID       string
	fromRegistry bool
	// held says the workspace already holds an image with this layer, so
	// a copy on disk may be reused without reading the layer again.
	held   bool
	track  *tracker
	budget *budget
}

// ensureLayer makes layers/sha256/<diffID> exist, unpacking the layer at
// most once per store no matter how many goroutines ask, and returns its
// uncompressed size. The layer's bytes are checked against diffID before
// the directory is published by rename. A layer already on disk is reused
// only if the workspace holds it or its bytes from this source hash to the
// same diffID: an image claiming another workspace's diffID without its
// content gets nothing.
func (s *Store) ensureLayer(ctx context.Context, j layerJob) (int64, error) {
	dir, err := s.layerDir(j.diffID)
	if err != nil {
		return 0, err
	}
	unlock, err := s.lockLayer(ctx, j.diffID)
	if err != nil {
		return 0, err
	}
	defer unlock()

	size, have := s.haveLayer(dir)
	if have && j.held {
		if j.fromRegistry {
			if n, err := j.l.Size(); err == nil {
				j.track.report(n)
			}
		}
		return size, nil
	}
	src, closeAll, err := openLayer(j)
	if err != nil {
		return 0, err
	}
	meter := &layerMeter{b: j.budget}
	h := sha256.New()
	ur := &countingReader{r: io.TeeReader(&capReader{r: src, max: j.budget.layer, err: j.budget.layerErr}, h)}
	if have {
		_, err = io.Copy(io.Discard, ur)
		if cerr := closeAll(err == nil); err == nil && cerr != nil {
			err = fmt.Errorf("read blob: %w", cerr)
		}
		if err != nil {
			return 0, err
		}
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != j.diffID {
			return 0, fmt.Errorf("content is %s, want diff_id %s: %w", got, j.diffID, errdefs.ErrInvalid)
		}
		return size, nil
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
	err = unpackLayer(ctx, ur, tmp, meter.charge, s.log)
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
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != j.diffID {
		return 0, fmt.Errorf("content is %s, want diff_id %s: %w", got, j.diffID, errdefs.ErrInvalid)
	}
	s.faults.Hit(fault.ImageUnpacked)
	if err := s.writeJSON(dir+".json", layerMeta{Size: ur.n}); err != nil {
		return 0, fmt.Errorf("write layer meta: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return 0, fmt.Errorf("publish: %w", err)
	}
	published = true
	s.unpacks.Add(1)
	s.log.Debug("image: unpacked layer", "diff_id", j.diffID, "bytes", ur.n)
	return ur.n, nil
}

// openLayer opens j's uncompressed stream. closeAll(drain) closes it;
// drain first reads the compressed blob to EOF so the registry reader
// verifies its digest.
func openLayer(j layerJob) (io.ReadCloser, func(drain bool) error, error) {
	if !j.fromRegistry {
		rc, err := j.l.Uncompressed()
		if err != nil {
			return nil, nil, fmt.Errorf("open: %w", err)
		}
		return rc, func(bool) error { return rc.Close() }, nil
	}
	rc, err := j.l.Compressed()
	if err != nil {
		return nil, nil, fmt.Errorf("fetch: %w", err)
	}
	cr := &countingReader{r: &capReader{r: rc, max: j.budget.layer, err: j.budget.layerErr}, track: j.track}
	src, err := decompress(cr)
	if err != nil {
		rc.Close()
		return nil, nil, err
	}
	return src, func(drain bool) error {
		var derr error
		if drain {
			_, derr = io.Copy(io.Discard, cr)
		}
		src.Close()
		if cerr := rc.Close(); derr == nil {
			derr = cerr
		}
		return derr
	}, nil
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

// maxZstdWindow bounds the history a zstd layer may make the decoder keep
// in memory (the library's default is 512 MiB, chosen by the frame). zstd
// levels up to 19 use at most 8 MiB; --long=27 uses 128 MiB.
const maxZstdWindow = 128 << 20

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
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		return zr.IOReadCloser(), nil
	default:
		return io.NopCloser(br), nil
	}
}

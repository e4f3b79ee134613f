package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Annotations that name an image inside an OCI layout.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// Load imports every image in an archive at path into workspace ws: a
// `docker save` tarball, a tar of an OCI image layout, or an OCI layout
// directory (each optionally gzip-compressed when a file). Names found in
// the archive are recorded; name, if set, is recorded too and becomes the
// returned Ref, and is only allowed for a single-image archive. Loaded
// names take precedence over any registry in ws's Resolve, and in no other
// workspace's. The caller must Release each image returned.
//
// Archives carrying both an OCI layout and a docker manifest.json (Docker
// 25+) are read as OCI, so digests match the registry's. A docker-only
// archive has no manifest; its Digest is that of a synthetic OCI manifest
// over the uncompressed layers, stable for the same archive content.
func (s *Store) Load(ctx context.Context, ws, path, name string) ([]*Image, error) {
	imgs, err := s.load(ctx, ws, path, name)
	if err != nil {
		return nil, fmt.Errorf("load image archive %s: %w", path, err)
	}
	return imgs, nil
}

// LoadReader is Load of an archive streamed from r, spooled under the
// store's staging dir; an archive larger than MaxArchiveBytes is refused
// once that much has arrived.
func (s *Store) LoadReader(ctx context.Context, ws string, r io.Reader, name string) ([]*Image, error) {
	max, err := s.MaxArchiveBytes()
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Join(s.root, "tmp"), "upload-*.tar")
	if err != nil {
		return nil, fmt.Errorf("buffer image archive: %w", err)
	}
	defer os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(r, max+1))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("receive image archive: %w", err)
	}
	if n > max {
		return nil, tooBig("image archive", max)
	}
	imgs, err := s.load(ctx, ws, f.Name(), name)
	if err != nil {
		return nil, fmt.Errorf("load image archive: %w", err)
	}
	return imgs, nil
}

func (s *Store) load(ctx context.Context, ws, path, override string) ([]*Image, error) {
	if override != "" {
		c, err := s.canonical(override)
		if err != nil {
			return nil, err
		}
		override = c
	}
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		}
		return nil, err
	}
	if st.IsDir() {
		return s.loadLayout(ctx, ws, path, override)
	}
	path, cleanup, err := s.gunzipIfNeeded(path)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	names, err := tarNames(path)
	if err != nil {
		return nil, err
	}
	_, isIndex := names["index.json"]
	_, isLayout := names["oci-layout"]
	_, isDocker := names["manifest.json"]
	switch {
	case isIndex && isLayout:
		dir, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), "layout-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		if err := extractLayout(ctx, path, dir); err != nil {
			return nil, fmt.Errorf("extract OCI layout: %w", err)
		}
		return s.loadLayout(ctx, ws, dir, override)
	case isDocker:
		return s.loadDocker(ctx, ws, path, names, override)
	default:
		return nil, fmt.Errorf("neither a docker-save nor an OCI archive: %w", errdefs.ErrInvalid)
	}
}

// gunzipIfNeeded returns a path to an uncompressed copy of a gzip file (in
// the staging dir), or path itself.
func (s *Store) gunzipIfNeeded(path string) (string, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	head := make([]byte, 2)
	if _, err := io.ReadFull(f, head); err != nil || !bytes.Equal(head, gzipMagic) {
		return path, func() {}, nil
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", nil, err
	}
	zr, err := decompress(bufio.NewReader(f))
	if err != nil {
		return "", nil, err
	}
	defer zr.Close()
	out, err := os.CreateTemp(filepath.Join(s.root, "tmp"), "archive-*.tar")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.Remove(out.Name()) }
	max, err := s.MaxArchiveBytes()
	if err == nil {
		_, err = io.Copy(out, &capReader{r: zr, max: max, err: func() error { return tooBig("uncompressed image archive", max) }})
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		cleanup()
		return "", nil, fmt.Errorf("gunzip: %w", err)
	}
	return out.Name(), cleanup, nil
}

// tarNames lists the (cleaned) names of regular files in a tar, with their
// sizes.
func tarNames(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int64{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read tar: %w: %w", errdefs.ErrInvalid, err)
		}
		if n, err := cleanName(hdr.Name); err == nil && hdr.Typeflag == tar.TypeReg {
			out[n] = hdr.Size
		}
	}
}

// extractLayout writes the regular files of an OCI layout tar under dir.
// Only plain files and directories are created, so no entry can redirect
// a later one outside dir.
func extractLayout(ctx context.Context, path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		rel, err := cleanName(hdr.Name)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("extract %s: %w", rel, err)
		}
	}
}

// loadLayout ingests each image named in an OCI layout's index.json; a
// nested index is narrowed to Platform.
func (s *Store) loadLayout(ctx context.Context, ws, dir, override string) (_ []*Image, err error) {
	if err := checkFileSize(filepath.Join(dir, "index.json"), MaxManifestBytes, "index.json"); err != nil {
		return nil, err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("open OCI layout: %w: %w", errdefs.ErrInvalid, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("read OCI index: %w: %w", errdefs.ErrInvalid, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read OCI index: %w: %w", errdefs.ErrInvalid, err)
	}
	type entry struct {
		img  v1.Image
		refs []string
	}
	var entries []entry
	for _, desc := range im.Manifests {
		img, err := layoutImage(dir, idx, desc)
		if err != nil {
			return nil, err
		}
		if img == nil {
			s.log.Warn("image load: skipping non-image descriptor", "digest", desc.Digest, "media_type", desc.MediaType)
			continue
		}
		var refs []string
		if r := s.annotationRef(desc.Annotations); r != "" {
			refs = append(refs, r)
		}
		entries = append(entries, entry{img: img, refs: refs})
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("no images in archive: %w", errdefs.ErrInvalid)
	}
	if override != "" && len(entries) > 1 {
		return nil, fmt.Errorf("name %s given for an archive of %d images: %w", override, len(entries), errdefs.ErrInvalid)
	}
	var out []*Image
	defer releaseOnError(&err, &out)
	for _, e := range entries {
		src, err := sourceOf(e.img)
		if err != nil {
			return nil, err
		}
		refs := e.refs
		if override != "" {
			refs = append([]string{override}, refs...)
		}
		img, err := s.ingest(ctx, src, ingestTarget{ws: ws, refs: dedupe(refs)}, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, img)
	}
	return out, nil
}

// layoutImage returns the image a layout descriptor names, narrowing an
// index to Platform (Docker's OCI export keeps only the local platform's
// blobs). nil means the descriptor is not an image. The manifest and config
// blobs are size-checked on disk before ggcr reads them whole.
func layoutImage(dir string, idx v1.ImageIndex, desc v1.Descriptor) (v1.Image, error) {
	if desc.MediaType.IsImage() || desc.MediaType.IsIndex() {
		if err := checkLayoutBlob(dir, desc.Digest, MaxManifestBytes, "manifest "+desc.Digest.String()); err != nil {
			return nil, err
		}
	}
	switch {
	case desc.MediaType.IsImage():
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("read image %s: %w", desc.Digest, err)
		}
		m, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("read image %s: %w: %w", desc.Digest, errdefs.ErrInvalid, err)
		}
		if err := checkLayoutBlob(dir, m.Config.Digest, MaxConfigBytes, "image config"); err != nil {
			return nil, err
		}
		return img, nil
	case desc.MediaType.IsIndex():
		child, err := idx.ImageIndex(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("read index %s: %w", desc.Digest, err)
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, fmt.Errorf("read index %s: %w", desc.Digest, err)
		}
		for _, d := range cm.Manifests {
			if d.MediaType.IsImage() && (d.Platform == nil || d.Platform.Satisfies(Platform)) {
				return layoutImage(dir, child, d)
			}
		}
		return nil, fmt.Errorf("index %s has no %s/%s image: %w", desc.Digest, Platform.OS, Platform.Architecture, errdefs.ErrNotFound)
	}
	return nil, nil
}

// checkLayoutBlob refuses a layout blob larger than max bytes on disk.
func checkLayoutBlob(dir string, h v1.Hash, max int64, what string) error {
	return checkFileSize(filepath.Join(dir, "blobs", h.Algorithm, h.Hex), max, what)
}

// checkFileSize refuses a file larger than max bytes; a missing file is
// left for the reader to report.
func checkFileSize(path string, max int64, what string) error {
	st, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if st.Size() > max {
		return tooBig(what, max)
	}
	return nil
}

// annotationRef returns the canonical name recorded in layout annotations,
// or "" when there is none or only a bare tag.
func (s *Store) annotationRef(ann map[string]string) string {
	for _, k := range []string{annotationContainerdName, annotationRefName} {
		v := ann[k]
		if v == "" || !strings.ContainsAny(v, "/:") {
			continue
		}
		if c, err := s.canonical(v); err == nil {
			return c
		}
	}
	return ""
}

// loadDocker ingests each image of a `docker save` tarball (manifest.json).
// sizes are the tar's file sizes, checked before ggcr reads the manifest
// and configs whole.
func (s *Store) loadDocker(ctx context.Context, ws, path string, sizes map[string]int64, override string) (_ []*Image, err error) {
	if sizes["manifest.json"] > MaxManifestBytes {
		return nil, tooBig("manifest.json", MaxManifestBytes)
	}
	opener := func() (io.ReadCloser, error) { return os.Open(path) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("read manifest.json: %w: %w", errdefs.ErrInvalid, err)
	}
	if override != "" && len(m) > 1 {
		return nil, fmt.Errorf("name %s given for an archive of %d images: %w", override, len(m), errdefs.ErrInvalid)
	}
	var out []*Image
	defer releaseOnError(&err, &out)
	for _, d := range m {
		if c, err := cleanName(d.Config); err == nil && sizes[c] > MaxConfigBytes {
			return nil, tooBig("image config "+d.Config, MaxConfigBytes)
		}
		var refs []string
		var tag *name.Tag
		for _, rt := range d.RepoTags {
			t, err := name.NewTag(rt)
			if err != nil {
				s.log.Warn("image load: ignoring bad tag", "tag", rt, "err", err)
				continue
			}
			if tag == nil {
				tag = &t
			}
			if c, err := s.canonical(rt); err == nil {
				refs = append(refs, c)
			}
		}
		if tag == nil && len(m) > 1 {
			s.log.Warn("image load: skipping untagged image in multi-image archive", "config", d.Config)
			continue
		}
		img, err := tarball.Image(opener, tag)
		if err != nil {
			return nil, fmt.Errorf("read image %s: %w", d.Config, err)
		}
		src, err := dockerSource(img)
		if err != nil {
			return nil, err
		}
		if override != "" {
			refs = append([]string{override}, refs...)
		}
		loaded, err := s.ingest(ctx, src, ingestTarget{ws: ws, refs: dedupe(refs)}, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, loaded)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no images in archive: %w", errdefs.ErrInvalid)
	}
	return out, nil
}

// dockerSource describes a docker-save image, whose archive has no
// manifest. The manifest is synthesised by ingest once layer sizes are
// known (see syntheticManifest); asking ggcr for one would gzip every
// layer just to hash it.
func dockerSource(img v1.Image) (*source, error) {
	src, err := configAndLayers(img)
	if err != nil {
		return nil, err
	}
	cfgSum := sha256.Sum256(src.rawConfig)
	src.configName = "sha256:" + hex.EncodeToString(cfgSum[:])
	return src, nil
}

// syntheticManifest is an OCI manifest over uncompressed layers (digest =
// diffID, size = uncompressed bytes) — the form Docker 25+ itself exports —
// so the same archive content always gets the same digest.
func syntheticManifest(src *source, sizes []int64) (string, []byte, error) {
	cfgName, err := v1.NewHash(src.configName)
	if err != nil {
		return "", nil, err
	}
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        v1.Descriptor{MediaType: types.OCIConfigJSON, Size: int64(len(src.rawConfig)), Digest: cfgName},
		Layers:        []v1.Descriptor{},
	}
	for i, d := range src.config.RootFS.DiffIDs {
		m.Layers = append(m.Layers, v1.Descriptor{MediaType: types.OCIUncompressedLayer, Size: sizes[i], Digest: d})
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(raw)
	return "sha256:" + hex.EncodeToString(sum[:]), raw, nil
}

// releaseOnError releases the images loaded so far when the load fails.
func releaseOnError(err *error, imgs *[]*Image) {
	if *err != nil {
		for _, img := range *imgs {
			img.Release()
		}
	}
}

func dedupe(refs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, r := range refs {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

package image

import (
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	goruntime "runtime"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteRootfsArchive writes a `docker save` tarball of a one-layer image
// named ref whose layer is the root filesystem tarball at rootfs and whose
// config is cfg (like `docker import`). The layer is gzipped at the
// fastest level: the archive is a transport, unpacked right away.
func WriteRootfsArchive(w io.Writer, ref, rootfs string, cfg v1.Config) error {
	r, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", ref, err)
	}
	layer, err := tarball.LayerFromFile(rootfs, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return fmt.Errorf("read rootfs %s: %w", rootfs, err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		return err
	}
	return tarball.Write(r, img, w)
}

// ImportRootfs loads the root filesystem tarball at rootfs into workspace
// ws as a one-layer image named ref with config cfg, as Load would load
// WriteRootfsArchive's output but without its gzip round trip: the layer
// is read uncompressed (once to hash it, once to unpack it) and the
// manifest synthesised as for a docker-save archive. The caller must
// Release the image.
func (s *Store) ImportRootfs(ctx context.Context, ws, rootfs, ref string, cfg v1.Config) (*Image, error) {
	canon, err := s.canonical(ref)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromFile(rootfs)
	if err != nil {
		return nil, fmt.Errorf("import rootfs %s: %w", rootfs, err)
	}
	diffID, err := layer.DiffID()
	if err != nil {
		return nil, fmt.Errorf("import rootfs %s: %w", rootfs, err)
	}
	cf := &v1.ConfigFile{Architecture: goruntime.GOARCH, OS: "linux", Config: cfg,
		RootFS: v1.RootFS{Type: "layers", DiffIDs: []v1.Hash{diffID}}}
	raw, err := json.Marshal(cf)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	src := &source{configName: "sha256:" + hex.EncodeToString(sum[:]), rawConfig: raw, config: cf, layers: []v1.Layer{layer}}
	img, err := s.ingest(ctx, src, ingestTarget{ws: ws, refs: []string{canon}}, nil)
	if err != nil {
		return nil, fmt.Errorf("import rootfs %s: %w", rootfs, err)
	}
	return img, nil
}

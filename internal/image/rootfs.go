package image

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

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
// ws as a one-layer image named ref with config cfg (see
// WriteRootfsArchive and Load). The caller must Release the image.
func (s *Store) ImportRootfs(ctx context.Context, ws, rootfs, ref string, cfg v1.Config) (*Image, error) {
	f, err := os.CreateTemp(filepath.Join(s.root, "tmp"), "import-*.tar")
	if err != nil {
		return nil, fmt.Errorf("stage rootfs import: %w", err)
	}
	defer os.Remove(f.Name())
	err = WriteRootfsArchive(f, ref, rootfs, cfg)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("import rootfs %s: %w", rootfs, err)
	}
	imgs, err := s.Load(ctx, ws, f.Name(), ref)
	if err != nil {
		return nil, fmt.Errorf("import rootfs %s: %w", rootfs, err)
	}
	return imgs[0], nil
}

package image

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
)

// refs under .invalid can never resolve over the network, so a successful
// Resolve proves the store answered locally.
const offlineRef = "registry.invalid/test/app:v1"

func checkOverlayLayers(t *testing.T, img *Image) {
	t.Helper()
	if len(img.Layers) != 2 {
		t.Fatalf("Layers = %v, want 2", img.Layers)
	}
	if b, err := os.ReadFile(filepath.Join(img.Layers[0], "a/keep")); err != nil || string(b) != "keep" {
		t.Errorf("bottom layer a/keep = %q (%v)", b, err)
	}
	if st := lstat(t, filepath.Join(img.Layers[1], "a/gone")); st.Rdev != 0 || st.Mode&0o170000 != 0o020000 {
		t.Errorf("top layer a/gone is not a whiteout device: mode %o", st.Mode)
	}
}

func TestLoadDockerArchive(t *testing.T) {
	requireRoot(t)
	path := imagetest.WriteDockerArchive(t, overlayStack(t), offlineRef)
	s := newStore(t)
	ctx := context.Background()
	imgs, err := s.Load(ctx, wsA, path, "")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Ref != offlineRef || imgs[0].Size == 0 {
		t.Fatalf("Load = %+v, want one image named %s", imgs, offlineRef)
	}
	got, err := s.Resolve(ctx, wsA, offlineRef, nil, nil)
	if err != nil {
		t.Fatalf("Resolve after Load: %v", err)
	}
	if got.Digest != imgs[0].Digest {
		t.Errorf("Resolve digest %s, Load digest %s", got.Digest, imgs[0].Digest)
	}
	checkOverlayLayers(t, got)

	// Loading the same archive again is idempotent: same synthetic digest,
	// no new unpacks.
	before := s.unpacks.Load()
	again, err := s.Load(ctx, wsA, path, "other/name:2")
	if err != nil || again[0].Digest != got.Digest || s.unpacks.Load() != before {
		t.Fatalf("reload: %v, digest %s vs %s, %d new unpacks", err, again[0].Digest, got.Digest, s.unpacks.Load()-before)
	}
	if again[0].Ref != "index.docker.io/other/name:2" {
		t.Errorf("override ref = %q", again[0].Ref)
	}
	if _, err := s.Resolve(ctx, wsA, "other/name:2", nil, nil); err != nil {
		t.Errorf("Resolve(override name): %v", err)
	}
}

func TestLoadGzippedDockerArchive(t *testing.T) {
	requireRoot(t)
	path := imagetest.WriteDockerArchive(t, overlayStack(t), offlineRef)
	gz := filepath.Join(t.TempDir(), "image.tar.gz")
	in, _ := os.Open(path)
	out, _ := os.Create(gz)
	zw := gzip.NewWriter(out)
	if _, err := io.Copy(zw, in); err != nil {
		t.Fatal(err)
	}
	zw.Close()
	out.Close()
	in.Close()
	imgs, err := newStore(t).Load(context.Background(), wsA, gz, "")
	if err != nil || len(imgs) != 1 {
		t.Fatalf("Load(gzip): %v", err)
	}
	checkOverlayLayers(t, imgs[0])
}

func TestLoadOCIArchive(t *testing.T) {
	requireRoot(t)
	stack := overlayStack(t)
	s := newStore(t)
	ctx := context.Background()
	imgs, err := s.Load(ctx, wsA, imagetest.WriteOCIArchive(t, stack), offlineRef)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(imgs) != 1 || imgs[0].Digest != digestOf(t, stack) {
		t.Fatalf("Load = %+v, want digest %s (OCI keeps the real manifest)", imgs, digestOf(t, stack))
	}
	got, err := s.Resolve(ctx, wsA, offlineRef, nil, nil)
	if err != nil {
		t.Fatalf("Resolve after Load: %v", err)
	}
	checkOverlayLayers(t, got)
}

func TestLoadOCILayoutDirWithNames(t *testing.T) {
	requireRoot(t)
	dir := imagetest.WriteOCILayout(t, overlayStack(t), offlineRef)
	s := newStore(t)
	imgs, err := s.Load(context.Background(), wsA, dir, "")
	if err != nil || len(imgs) != 1 || imgs[0].Ref != offlineRef {
		t.Fatalf("Load(dir) = %+v, %v; want named %s from annotation", imgs, err, offlineRef)
	}
	if _, err := s.Resolve(context.Background(), wsA, offlineRef, nil, nil); err != nil {
		t.Fatalf("Resolve after Load: %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Load(ctx, wsA, filepath.Join(t.TempDir(), "nope.tar"), ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Load(missing) = %v, want ErrNotFound", err)
	}
	junk := filepath.Join(t.TempDir(), "junk.tar")
	os.WriteFile(junk, imagetest.TarBytes(t, imagetest.File("hello", 0o644, "x")), 0o644)
	if _, err := s.Load(ctx, wsA, junk, ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Load(non-image tar) = %v, want ErrInvalid", err)
	}
	if _, err := s.Load(ctx, wsA, junk, "Bad Name!"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Load(bad name) = %v, want ErrInvalid", err)
	}
}

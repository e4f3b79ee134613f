package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Epoch is the mtime given to every entry built here, so digests are
// reproducible.
var Epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// Entry is one tar entry of a test layer. Zero ModTime means Epoch; a
// regular file's Size is taken from Body.
type Entry struct {
	tar.Header
	Body string
}

// Dir is a directory entry. Like the other entry builders it is root
// owned with an Epoch mtime; set fields on the result to change that.
func Dir(name string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}}
}

// File is a regular file entry with the given body.
func File(name string, mode int64, body string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, Body: body}
}

// Symlink is a symlink entry name → target.
func Symlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

// Hardlink is a hardlink entry name → target (an earlier entry's name).
func Hardlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}}
}

// Whiteout is the OCI whiteout entry hiding path in lower layers
// (".wh.<base>" in the same directory).
func Whiteout(path string) Entry {
	dir, base := filepath.Split(path)
	return File(dir+".wh."+base, 0o644, "")
}

// Opaque is the OCI marker hiding everything lower layers have under dir.
func Opaque(dir string) Entry {
	return File(filepath.Join(dir, ".wh..wh..opq"), 0o644, "")
}

// TarBytes serialises entries, in order, as an uncompressed tar.
func TarBytes(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		if h.ModTime.IsZero() {
			h.ModTime = Epoch
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if h.Format == tar.FormatUnknown && len(h.PAXRecords) > 0 {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("imagetest: tar header %s: %v", h.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				t.Fatalf("imagetest: tar body %s: %v", h.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("imagetest: close tar: %v", err)
	}
	return buf.Bytes()
}

// Layer is a gzip-compressed layer of entries.
func Layer(t testing.TB, entries ...Entry) v1.Layer {
	t.Helper()
	return LayerFromTar(t, TarBytes(t, entries...))
}

// LayerFromTar wraps an uncompressed tar as a gzip-compressed layer.
func LayerFromTar(t testing.TB, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
	if err != nil {
		t.Fatalf("imagetest: layer: %v", err)
	}
	return l
}

// Image stacks layers (bottom first) into a linux/amd64 image with cfg as
// its run config.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatalf("imagetest: append layers: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatalf("imagetest: config: %v", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: Epoch}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatalf("imagetest: set config: %v", err)
	}
	return img
}

// WriteDockerArchive writes img as a `docker save` tarball tagged ref and
// returns its path (in a per-test temp dir).
func WriteDockerArchive(t testing.TB, img v1.Image, ref string) string {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatalf("imagetest: tag %s: %v", ref, err)
	}
	p := filepath.Join(t.TempDir(), "image-docker.tar")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatalf("imagetest: write docker archive: %v", err)
	}
	return p
}

// WriteOCIArchive writes img as a tar of an OCI image layout and returns
// its path. Each of names (full references) is recorded as an
// org.opencontainers.image.ref.name annotation; with none the image is
// unnamed.
func WriteOCIArchive(t testing.TB, img v1.Image, names ...string) string {
	t.Helper()
	dir := WriteOCILayout(t, img, names...)
	p := filepath.Join(t.TempDir(), "image-oci.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatalf("imagetest: %v", err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatalf("imagetest: tar OCI layout: %v", err)
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("imagetest: tar OCI layout: %v", err)
	}
	return p
}

// WriteOCILayout writes img as an OCI image layout directory and returns
// it; names as for WriteOCIArchive.
func WriteOCILayout(t testing.TB, img v1.Image, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatalf("imagetest: OCI layout: %v", err)
	}
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		var opts []layout.Option
		if n != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": n}))
		}
		if err := lp.AppendImage(img, opts...); err != nil {
			t.Fatalf("imagetest: OCI layout append: %v", err)
		}
	}
	return dir
}

func basic(user, pass string) authn.Authenticator {
	return &authn.Basic{Username: user, Password: pass}
}

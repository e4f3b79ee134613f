package blueprint

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image"
)

// TestImportedRootfs: --default-image FILE with a plain root filesystem
// tarball imports it (no name left in the image store: the snapshot
// keeps the layers), and replacing the file changes the key, so the next
// start imports it again.
func TestImportedRootfs(t *testing.T) {
	images, err := image.NewStore(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rootfs.tar")
	writeTar := func(body string) {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(f)
		tw.WriteHeader(&tar.Header{Name: "etc/motd", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
		tw.Close()
		f.Close()
	}
	writeTar("one")
	src := &Imported{Name: "default", Spec: path, Images: images}
	key := src.Key()
	var steps []string
	img, pkgs, err := src.Make(context.Background(), "builtin", func(step string, _ int) { steps = append(steps, step) })
	if err != nil {
		t.Fatal(err)
	}
	defer img.Release()
	if pkgs != nil || len(img.Layers) != 1 || len(steps) == 0 {
		t.Fatalf("imported %d layers, packages %v, steps %q", len(img.Layers), pkgs, steps)
	}
	if b, err := os.ReadFile(filepath.Join(img.Layers[0], "etc/motd")); err != nil || string(b) != "one" {
		t.Fatalf("motd in the layer: %q, %v", b, err)
	}
	if l, _ := images.List(context.Background(), "builtin"); len(l) != 0 {
		t.Fatalf("the import left %d names", len(l))
	}
	time.Sleep(10 * time.Millisecond) // a distinct mtime
	writeTar("two!")
	if src.Key() == key {
		t.Fatal("replacing the file kept the key")
	}
	if (&Imported{Spec: "python:3.12-slim"}).Key() == key {
		t.Fatal("a reference and a file share a key")
	}
}

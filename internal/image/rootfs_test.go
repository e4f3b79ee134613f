package image

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestImportRootfs: a root filesystem tarball becomes a one-layer image
// under the given name, in the given workspace only, with the given
// config, setuid bits kept (sudo needs them).
func TestImportRootfs(t *testing.T) {
	s := newStore(t)
	rootfs := filepath.Join(t.TempDir(), "rootfs.tar")
	f, err := os.Create(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, e := range []struct {
		name string
		mode int64
	}{{"usr/bin/sudo", 0o4755}, {"etc/os-release", 0o644}} {
		body := []byte("x-" + e.name)
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	f.Close()

	cfg := v1.Config{User: "user", WorkingDir: "/home/user", Env: []string{"LANG=C.UTF-8"}}
	img, err := s.ImportRootfs(context.Background(), wsA, rootfs, "cubicle-builtin/default:k1", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer img.Release()
	if len(img.Layers) != 1 || img.Config.User != "user" || img.Config.WorkDir != "/home/user" || img.Config.EnvVars["LANG"] != "C.UTF-8" {
		t.Fatalf("imported %d layers, config %+v", len(img.Layers), img.Config)
	}
	st, err := os.Stat(filepath.Join(img.Layers[0], "usr/bin/sudo"))
	if err != nil || st.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("sudo in the layer: %v, mode %v; want setuid", err, st.Mode())
	}
	got, err := s.Resolve(context.Background(), wsA, "cubicle-builtin/default:k1", nil, nil)
	if err != nil || got.Digest != img.Digest {
		t.Fatalf("resolve the imported name: %v, %v", got, err)
	}
	got.Release()
	if imgs, _ := s.List(context.Background(), wsB); len(imgs) != 0 {
		t.Fatalf("another workspace sees %d images", len(imgs))
	}
}

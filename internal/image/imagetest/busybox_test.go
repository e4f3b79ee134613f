package imagetest_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestBusyboxImageRunsBash proves the image is usable as a rootfs: bash and
// busybox applets run chrooted into the pulled layer, as the app user too.
func TestBusyboxImageRunsBash(t *testing.T) {
	testenv.RequireRoot(t, "to chroot")
	img := imagetest.BusyboxImage(t)
	d1, _ := img.Digest()
	d2, _ := imagetest.BusyboxImage(t).Digest()
	if d1 != d2 {
		t.Fatalf("BusyboxImage not deterministic: %s vs %s", d1, d2)
	}

	ref := imagetest.Push(t, imagetest.StartRegistry(t), "busybox:test", img)
	s, err := image.NewStore(t.TempDir(), image.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Resolve(context.Background(), "test", ref, nil, nil)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got.Digest != d1.String() {
		t.Errorf("pulled digest %s, built %s", got.Digest, d1)
	}

	for _, tc := range []struct {
		uid  uint32
		want string
	}{{0, "root"}, {1000, "app"}} {
		cmd := exec.Command("/bin/bash", "-c", `echo "$(whoami):$(ls /bin/ls):$BASH_VERSION" && touch /tmp/x`)
		cmd.Env = []string{"PATH=" + imagetest.DefaultPath}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: got.Layers[0], Credential: &syscall.Credential{Uid: tc.uid, Gid: tc.uid}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash as uid %d: %v: %s", tc.uid, err, out)
		}
		if !strings.HasPrefix(string(out), tc.want+":/bin/ls:5.") {
			t.Errorf("bash as uid %d printed %q", tc.uid, out)
		}
		os.Remove(got.Layers[0] + "/tmp/x") // keep the shared layer pristine
	}
}

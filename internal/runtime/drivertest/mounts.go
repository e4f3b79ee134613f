package drivertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// testMounts: a read-write bind shows the host's files and takes writes
// (owned by host root, as the upper dir's are), which reach the host
// directory and not the sandbox's upper dir; a read-only bind refuses
// writes, root's included.
func testMounts(t *testing.T, env *Env, d runtime.Driver) {
	rw, ro := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(rw, "in.txt"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ro, "ro.txt"), []byte("read only\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := env.Start(t, d, runtime.Limits{}, func(sp *runtime.Spec) {
		sp.Mounts = []runtime.Mount{{Source: rw, Target: "/mnt/data"}, {Source: ro, Target: "/srv/ro", ReadOnly: true}}
	})
	out := s.MustExec(t, "cat /mnt/data/in.txt /srv/ro/ro.txt && echo out > /mnt/data/out.txt && stat -c %u /mnt/data/out.txt")
	if out != "from host\nread only\n0\n" {
		t.Fatalf("inside: %q", out)
	}
	if _, stderr, code := s.Exec(t, "touch /srv/ro/x"); code == 0 || !strings.Contains(strings.ToLower(stderr), "read-only") {
		t.Fatalf("write to a read-only mount: exit %d, stderr %q", code, stderr)
	}
	fi, err := os.Stat(filepath.Join(rw, "out.txt"))
	if err != nil {
		t.Fatalf("host side of the bind: %v", err)
	}
	if uid := statUID(fi); uid != 0 {
		t.Errorf("out.txt on the host owned by uid %d, want 0", uid)
	}
	if _, err := os.Stat(filepath.Join(s.RootFS.Upper, "mnt/data/out.txt")); err == nil {
		t.Error("a write to the bind landed in the sandbox's upper dir")
	}
	if _, err := os.Stat(filepath.Join(ro, "x")); err == nil {
		t.Error("the read-only bind took a write")
	}
}

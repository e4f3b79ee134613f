package drivertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// testNetFiles: /etc/hosts and /etc/resolv.conf are the sandbox's own
// files (runtime.WriteNetFiles), not host files bound in: regular,
// root-owned, editable by root inside, stored in its upper dir, and an
// edit survives a stop and start.
func testNetFiles(t *testing.T, env *Env, d runtime.Driver) {
	s := env.Start(t, d, runtime.Limits{}, nil)
	out := s.MustExec(t, "grep -c "+s.Spec.Hostname+" /etc/hosts; grep -c '^nameserver ' /etc/resolv.conf; grep -cE ' /etc/(hosts|resolv.conf) ' /proc/self/mountinfo || true")
	if f := strings.Fields(out); len(f) != 3 || f[0] != "1" || f[1] == "0" || f[2] != "0" {
		t.Errorf("hostname lines, nameserver lines, mounts on /etc/hosts|resolv.conf = %q; want 1, >0, 0", out)
	}
	out = s.MustExec(t, "echo '10.1.2.3 edited.example' >> /etc/hosts && echo 'nameserver 10.1.2.4' > /etc/resolv.conf && stat -c %u:%g:%a /etc/hosts /etc/resolv.conf")
	if out != "0:0:644\n0:0:644\n" {
		t.Errorf("owner:group:mode inside = %q; want root's 0644 files", out)
	}
	b, err := os.ReadFile(filepath.Join(s.RootFS.Upper, "etc/hosts"))
	if err != nil || !strings.Contains(string(b), "edited.example") {
		t.Errorf("upper/etc/hosts = %q, %v; want the edit in the sandbox's own upper dir", b, err)
	}
	if err := d.Stop(context.Background(), s.Spec.ID); err != nil {
		t.Fatal(err)
	}
	s.Launch(t, d)
	if got := s.MustExec(t, "cat /etc/hosts"); !strings.Contains(got, "edited.example") || !strings.Contains(got, s.Spec.Hostname) {
		t.Errorf("/etc/hosts after restart = %q; want the edit kept", got)
	}
	if got := s.MustExec(t, "cat /etc/resolv.conf"); got != "nameserver 10.1.2.4\n" {
		t.Errorf("/etc/resolv.conf after restart = %q; want the edit kept", got)
	}
}

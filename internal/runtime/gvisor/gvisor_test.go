package gvisor

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

func TestStartStop(t *testing.T) {
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{})
	if got := s.get(t, "/hostname", nil); got != s.spec.Hostname {
		t.Errorf("hostname = %q, want %q", got, s.spec.Hostname)
	}
	s.get(t, "/write", url.Values{"path": {"/marker"}, "data": {"from-inside"}})
	b, err := os.ReadFile(filepath.Join(s.upper, "marker"))
	if err != nil || string(b) != "from-inside" {
		t.Errorf("upper/marker = %q, %v; want the sandbox's write in the host upper dir", b, err)
	}
	t.Log(s.sh(t, "cat /etc/resolv.conf /etc/hosts; ip addr; ls -la /.cubicle; id; cat /proc/self/status | grep -i cap"))
	ctx := context.Background()
	out, _ := exec.Command("ip", "-n", filepath.Base(s.spec.NetNS), "addr").CombinedOutput()
	t.Logf("host view of netns: %s", out)
	out, _ = exec.Command("find", s.upper).CombinedOutput()
	t.Logf("upper: %s", out)
	if ok, err := d.Running(ctx, s.id); err != nil || !ok {
		t.Fatalf("Running = %v, %v; want true", ok, err)
	}
	if err := d.Stop(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.Running(ctx, s.id); err != nil || ok {
		t.Fatalf("after Stop: Running = %v, %v; want false", ok, err)
	}
	if p := processesMentioning(s.id); len(p) > 0 {
		t.Errorf("processes left after Stop: %v", p)
	}
	if _, err := os.Stat(d.bundleDir(s.id)); !os.IsNotExist(err) {
		t.Errorf("state dir left after Stop: %v", err)
	}
	_ = strings.TrimSpace
}

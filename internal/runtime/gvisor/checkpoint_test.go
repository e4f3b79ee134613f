package gvisor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// TestCheckpointRestore checkpoints a sandbox running a counter and
// restores it on another rootfs mount (the captured upper as a lower, an
// empty upper) in another netns with another address: the counter goes on
// from where it was, the source keeps running, and Resume after a failed
// Checkpoint leaves the sandbox running.
func TestCheckpointRestore(t *testing.T) {
	e := requireEnv(t)
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{MemBytes: 256 << 20})
	ctx := context.Background()
	s.sh(t, `i=0; (while true; do i=$((i+1)); echo $i > /tmp/c; sleep 0.1; done) >/dev/null 2>&1 &`)
	time.Sleep(500 * time.Millisecond)
	before := readCounter(t, s)

	img := t.TempDir()
	t0 := time.Now()
	if err := d.Checkpoint(ctx, s.id, img); err != nil {
		d.Resume(ctx, s.id)
		t.Fatal(err)
	}
	// Paused: the filesystem is captured now.
	low := filepath.Join(t.TempDir(), "low")
	if out, err := exec.Command("cp", "-a", s.upper, low).CombinedOutput(); err != nil {
		t.Fatalf("copy upper: %v %s", err, out)
	}
	if err := d.Resume(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint + copy, paused for %v", time.Since(t0))
	atCapture := readCounter(t, s)

	base := t.TempDir()
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, dir := range []string{upper, work, merged} {
		os.Mkdir(dir, 0o755)
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, fmt.Sprintf("lowerdir=%s:%s,upperdir=%s,workdir=%s", low, e.lower, upper, work)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	ns, ip := netNS(t)
	spec := s.spec
	spec.ID, spec.RootFS, spec.NetNS, spec.Hostname = newID(t), merged, ns, "other"
	t0 = time.Now()
	if err := d.Restore(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop(context.Background(), spec.ID) })
	r := &sandbox{id: spec.ID, ip: ip, spec: spec}
	waitReady(t, r)
	t.Logf("restored and answering on %s after %v", ip, time.Since(t0))
	first := readCounter(t, r)
	time.Sleep(500 * time.Millisecond)
	second := readCounter(t, r)
	if first < before || second <= first {
		t.Fatalf("restored counter: %d then %d (source had %d before the checkpoint)", first, second, before)
	}
	if h := r.get(t, "/hostname", nil); h != s.spec.Hostname {
		t.Errorf("restored hostname %q, want the source's %q", h, s.spec.Hostname)
	}
	if src := readCounter(t, s); src <= atCapture {
		t.Errorf("source stopped counting: %d then %d", atCapture, src)
	}
	if pid, err := d.PID(ctx, spec.ID); err != nil || pid == 0 {
		t.Errorf("PID of restored sandbox: %d %v", pid, err)
	}

	// A checkpoint into a directory runsc cannot use fails, and Resume
	// still thaws the source.
	if err := d.Checkpoint(ctx, s.id, "/proc/nonexistent"); err == nil {
		t.Error("checkpoint into /proc/nonexistent succeeded")
	}
	if err := d.Resume(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	n := readCounter(t, s)
	time.Sleep(300 * time.Millisecond)
	if m := readCounter(t, s); m <= n {
		t.Fatalf("source not running after failed checkpoint + Resume: %d then %d", n, m)
	}
}

func readCounter(t *testing.T, s *sandbox) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s.sh(t, "cat /tmp/c")))
	if err != nil {
		t.Fatalf("counter in %s: %v", s.id, err)
	}
	return n
}

// TestSuspendEndsSandbox: Suspend saves a running sandbox and ends it (no
// Sentry left, PID 0), Stop then tears it down without signalling it, and
// the image restores on the same rootfs with /tmp as it was.
func TestSuspendEndsSandbox(t *testing.T) {
	requireEnv(t)
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{MemBytes: 256 << 20})
	ctx := context.Background()
	s.sh(t, `echo kept > /tmp/mark`)
	pid, err := d.PID(ctx, s.id)
	if err != nil || pid == 0 {
		t.Fatalf("PID before the suspend: %d %v", pid, err)
	}
	img := t.TempDir()
	if err := d.Suspend(ctx, s.id, img); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for unix.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the Sentry (pid %d) still runs after Suspend", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := d.Stop(ctx, s.id); err != nil {
		t.Fatalf("Stop after Suspend: %v", err)
	}
	spec := s.spec
	if err := d.Restore(ctx, spec, img); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop(context.Background(), spec.ID) })
	waitReady(t, s)
	if got := strings.TrimSpace(s.sh(t, `cat /tmp/mark`)); got != "kept" {
		t.Fatalf("/tmp/mark after the restore: %q", got)
	}
}

// Package drivertest is the conformance suite every runtime.Driver passes.
// It starts real sandboxes with the real agent on fixtures it builds itself
// (a busybox rootfs under an overlay, a veth-backed netns), and asserts only
// what is observable through the agent or on the host's files, so that the
// gvisor, namespace and future drivers are held to the same contract.
//
// The fixtures need root, a static busybox and a buildable cmd/cubicle;
// otherwise the suite skips with the reason.
package drivertest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// Run runs the suite. newDriver is called once per subtest; calling it again
// with the same *testing.T must return a driver over the same state (that is
// how the suite simulates a daemon restart), e.g. by deriving the state dir
// from t.Name().
func Run(t *testing.T, newDriver func(t *testing.T) runtime.Driver) {
	env := NewEnv(t)
	t.Run("EchoAndHostname", func(t *testing.T) {
		s := env.Start(t, newDriver(t), runtime.Limits{}, nil)
		out := s.MustExec(t, "echo hello; hostname")
		if want := "hello\n" + s.Spec.Hostname + "\n"; out != want {
			t.Fatalf("got %q, want %q", out, want)
		}
	})
	t.Run("WritesPersistInUpperOwnedByRoot", func(t *testing.T) {
		s := env.Start(t, newDriver(t), runtime.Limits{}, nil)
		out := s.MustExec(t, "echo data > /root/file.txt && touch /etc/x && stat -c %u:%g /etc/x /etc/passwd")
		if out != "0:0\n0:0\n" {
			t.Errorf("owners inside = %q, want root for created and image files", out)
		}
		for _, p := range []string{"root/file.txt", "etc/x"} {
			fi, err := os.Stat(filepath.Join(s.RootFS.Upper, p))
			if err != nil {
				t.Fatalf("upper dir: %v", err)
			}
			if uid := statUID(fi); uid != 0 {
				t.Errorf("%s in upper dir owned by uid %d, want 0 (portable between drivers)", p, uid)
			}
		}
		if b, _ := os.ReadFile(filepath.Join(s.RootFS.Upper, "root/file.txt")); string(b) != "data\n" {
			t.Errorf("upper file content %q", b)
		}
	})
	t.Run("MountsAreBound", func(t *testing.T) { testMounts(t, env, newDriver(t)) })
	t.Run("NetFilesAreTheSandboxsOwn", func(t *testing.T) { testNetFiles(t, env, newDriver(t)) })
	t.Run("Isolation", func(t *testing.T) { testIsolation(t, env, newDriver(t)) })
	t.Run("SandboxesDoNotSeeEachOther", func(t *testing.T) {
		d := newDriver(t)
		a := env.Start(t, d, runtime.Limits{}, nil)
		b := env.Start(t, d, runtime.Limits{}, nil)
		a.MustExec(t, "echo secret > /root/a-secret; sleep 300 >/dev/null 2>&1 &")
		if _, _, code := b.Exec(t, "test -e /root/a-secret"); code == 0 {
			t.Error("sandbox b sees a's file")
		}
		if out := b.MustExec(t, "ps -o comm | grep -c '^sleep' || true"); strings.TrimSpace(out) != "0" {
			t.Errorf("sandbox b sees a's processes: %q", out)
		}
	})
	t.Run("MemoryHogIsKilled", func(t *testing.T) { testMemoryHog(t, env, newDriver(t)) })
	t.Run("UnderMemoryLimitIsNotKilled", func(t *testing.T) {
		s := env.Start(t, newDriver(t), runtime.Limits{MemBytes: 64 << 20, PidsMax: 256}, nil)
		// dd holds a 24 MiB buffer while it copies 480 MiB: well under the
		// limit next to the agent, and long enough for any guard to look.
		_, errOut, code := s.Exec(t, "dd if=/dev/zero of=/dev/null bs=24M count=20")
		if code != 0 {
			t.Fatalf("24 MiB under a 64 MiB limit: exit %d (stderr %q)", code, errOut)
		}
		if st := memGuardStats(t, s); st.Kills != 0 {
			t.Fatalf("guard killed under the limit: %+v", st.LastKill)
		}
	})
	t.Run("ForkBombIsContained", func(t *testing.T) { testForkBomb(t, env, newDriver(t), runtime.Limits{PidsMax: 64}) })
	// The daemon's default pids bound under a small memory limit: the
	// bomb must run out of tasks before the sandbox runs out of memory.
	t.Run("ForkBombUnderMemoryLimit", func(t *testing.T) {
		testForkBomb(t, env, newDriver(t), runtime.Limits{MemBytes: 256 << 20, PidsMax: 4096})
	})
	t.Run("TmpfsFillIsContained", func(t *testing.T) { testTmpfsFill(t, env, newDriver(t)) })
	// A sandbox sees as many CPUs as it has vCPUs (where the host has
	// more), so `make -j$(nproc)` and thread pools size to what it got.
	t.Run("NprocIsVCPUs", func(t *testing.T) {
		allowed, err := runtime.AllowedCPUs()
		if err != nil || len(allowed) < 2 {
			testenv.Skip(t, "needs a host with 2 or more CPUs (%v, %v)", allowed, err)
		}
		// /proc/cpuinfo agrees with nproc: readers of it (Python's
		// os.cpu_count fallbacks, JVMs, build tools) size to it.
		const count = "nproc; grep -c ^processor /proc/cpuinfo"
		s := env.Start(t, newDriver(t), runtime.Limits{MilliCPUs: 1000}, nil)
		if out := s.MustExec(t, count); out != "1\n1\n" {
			t.Fatalf("nproc and cpuinfo processors in a 1-vCPU sandbox on a %d-CPU host: %q", len(allowed), out)
		}
		all := env.Start(t, newDriver(t), runtime.Limits{MilliCPUs: int64(len(allowed)) * 1000}, nil)
		if n := strconv.Itoa(len(allowed)); all.MustExec(t, count) != n+"\n"+n+"\n" {
			t.Fatalf("nproc and cpuinfo processors with every CPU: %q, want %s", all.MustExec(t, count), n)
		}
	})
	t.Run("TokenHiddenInside", func(t *testing.T) { testTokenHidden(t, env, newDriver(t)) })
	t.Run("IdentityChangesWhileRunning", func(t *testing.T) { testIdentity(t, env, newDriver(t)) })
	t.Run("BackgroundCPUShare", func(t *testing.T) { testBackground(t, env, newDriver(t)) })
	t.Run("StopKillsEverything", func(t *testing.T) {
		d := newDriver(t)
		s := env.Start(t, d, runtime.Limits{}, nil)
		s.MustExec(t, "nohup sleep 300 >/dev/null 2>&1 &")
		ctx := context.Background()
		if err := d.Stop(ctx, s.Spec.ID); err != nil {
			t.Fatalf("Stop: %v", err)
		}
		if ok, err := d.Running(ctx, s.Spec.ID); err != nil || ok {
			t.Fatalf("Running after Stop = %v, %v", ok, err)
		}
		hctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if err := s.Client.Health(hctx); err == nil {
			t.Fatal("agent still answers after Stop")
		}
		if err := d.Stop(ctx, s.Spec.ID); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
		if err := d.Stop(ctx, NewID()); err != nil {
			t.Fatalf("Stop of unknown id: %v", err)
		}
	})
	t.Run("RunningAfterRestart", func(t *testing.T) {
		s := env.Start(t, newDriver(t), runtime.Limits{}, nil)
		restarted := newDriver(t)
		ctx := context.Background()
		if ok, err := restarted.Running(ctx, s.Spec.ID); err != nil || !ok {
			t.Fatalf("Running on a new driver instance = %v, %v; want true", ok, err)
		}
		if ok, err := restarted.Running(ctx, NewID()); err != nil || ok {
			t.Fatalf("Running(unknown) = %v, %v", ok, err)
		}
		if err := restarted.Stop(ctx, s.Spec.ID); err != nil {
			t.Fatalf("Stop via new instance: %v", err)
		}
		if ok, _ := restarted.Running(ctx, s.Spec.ID); ok {
			t.Fatal("still running after Stop")
		}
	})
}

// testIsolation checks that host files, processes, the daemon's data dir and
// host-loopback services are out of reach.
func testIsolation(t *testing.T, env *Env, d runtime.Driver) {
	dataDir := t.TempDir()
	os.WriteFile(filepath.Join(dataDir, "db.sqlite"), []byte("secret"), 0o600)
	marker := fmt.Sprintf("/root/.cubicle-drivertest-%s", NewID())
	if err := os.WriteFile(marker, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(marker) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port

	s := env.Start(t, d, runtime.Limits{}, nil)
	for _, p := range []string{marker, dataDir, filepath.Join(dataDir, "db.sqlite"), env.Base} {
		if _, _, code := s.Exec(t, "test -e "+p); code == 0 {
			t.Errorf("host path %s is visible inside", p)
		}
	}
	out := s.MustExec(t, "ls /proc | grep -c '^[0-9]'")
	if n, _ := strconv.Atoi(strings.TrimSpace(out)); n == 0 || n > 8 {
		t.Errorf("sandbox sees %d processes, want only its own few", n)
	}
	if cmd := s.MustExec(t, "tr '\\0' ' ' < /proc/1/cmdline"); !strings.Contains(cmd, "agent") {
		t.Errorf("PID 1 is %q, want the agent", cmd)
	}
	if _, _, code := s.Exec(t, fmt.Sprintf("nc -w 1 127.0.0.1 %d </dev/null", port)); code == 0 {
		t.Error("host loopback listener reachable from inside")
	}
	select {
	case <-accepted:
		t.Error("host loopback listener accepted a connection from the sandbox")
	default:
	}
}

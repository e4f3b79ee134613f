package drivertest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// memoryHogs are allocators the sandbox must survive under a 64 MiB limit,
// from the fastest (dd fills a 256 MiB buffer from /dev/zero: about 1 GiB/s
// under gVisor) to a shell that doubles a string until it dies.
var memoryHogs = []struct{ name, shell, command string }{
	{"dd256M", "/bin/sh", "dd if=/dev/zero of=/dev/null bs=256M count=1"},
	{"ddHeld", "/bin/sh", "dd if=/dev/zero of=/dev/null bs=200M count=20"},
	{"bashStringGrowth", "/bin/bash", "x=0123456789abcdef; while :; do x=$x$x; done"},
}

// testMemoryHog checks that a process over the sandbox's memory limit is
// killed like the kernel's OOM killer would (SIGKILL, exit 137) while the
// sandbox, its agent and its other processes live on. Where the agent's OOM
// guard is on (gVisor) the kill is also counted and explained on stderr.
func testMemoryHog(t *testing.T, env *Env, d runtime.Driver) {
	s := env.Start(t, d, runtime.Limits{MemBytes: 64 << 20, PidsMax: 256}, nil)
	s.MustExec(t, "sleep 600 >/dev/null 2>&1 & echo $! > /tmp/bystander")
	guarded := memGuardStats(t, s).Enabled
	var kills int64
	for _, h := range memoryHogs {
		if h.shell == "/bin/bash" && !s.hasFile(t, "/bin/bash") {
			continue
		}
		if guarded {
			settle(t, s)
		}
		t.Run(h.name, func(t *testing.T) {
			t0 := time.Now()
			_, errOut, code := s.ExecShell(t, h.shell, h.command)
			t.Logf("exit %d after %v; stderr %q", code, time.Since(t0).Round(time.Millisecond), errOut)
			if code != 137 {
				t.Fatalf("memory hog exited %d, want 137 (SIGKILL) under a 64 MiB limit", code)
			}
			if guarded {
				kills++
				if !strings.Contains(errOut, "out of memory") {
					t.Errorf("stderr does not say why: %q", errOut)
				}
				st := memGuardStats(t, s)
				if st.Kills != kills || st.LastKill == nil {
					t.Errorf("guard stats %+v, want %d kills", st, kills)
				}
			}
			if out := s.MustExec(t, "echo alive; kill -0 $(cat /tmp/bystander) && echo bystander"); out != "alive\nbystander\n" {
				t.Fatalf("after the OOM kill: %q, want the agent and the other process alive", out)
			}
		})
	}
}

// settle waits until the previous hog's memory is back: the guard sees
// usage drop at once, but gVisor returns freed pages to the host a few
// hundred milliseconds later, and until then a second hog counts twice
// against the host cgroup's backstop (see the gvisor driver's
// hostMemLimit). Back-to-back hogs are a real limitation, not what this
// test is about.
func settle(t *testing.T, s *Sandbox) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if st := memGuardStats(t, s); st.UsageBytes < st.LimitBytes/2 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
}

// memGuardStats asks the agent for its OOM guard's state.
func memGuardStats(tb testing.TB, s *Sandbox) agent.MemGuardStats {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.Client.MemGuard(ctx)
	if err != nil {
		tb.Fatalf("memguard stats: %v", err)
	}
	return st
}

// hasFile reports whether path exists in the sandbox.
func (s *Sandbox) hasFile(tb testing.TB, path string) bool {
	_, _, code := s.Exec(tb, "test -e "+path)
	return code == 0
}

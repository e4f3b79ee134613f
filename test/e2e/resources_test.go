package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestResourceAttacksSandboxLives performs, through the whole stack and on
// each runtime, the attacks that used to get a whole sandbox killed instead
// of the offending command: a classic fork bomb under the daemon's default
// pids bound, and filling /dev/shm and /tmp (memory, under gVisor) with
// twice the sandbox's memory. Each command must fail on its own while the
// sandbox stays ready, keeps its processes and answers the next exec.
func TestResourceAttacksSandboxLives(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "resources", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.MemBytes = int64p(256 << 20) })
			mustRun(t, d.Client, sb.Name, "sleep 600 >/dev/null 2>&1 & echo $! > /root/bystander")
			alive := func(after string) {
				t.Helper()
				for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
					out, _, code := run(t, d.Client, sb.Name, "kill -0 $(cat /root/bystander) && echo alive")
					if code == 0 && out == "alive\n" {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("after %s: %q (exit %d), want the sandbox and its other processes alive", after, out, code)
					}
				}
				got, err := d.Client.GetSandbox(context.Background(), sb.Name)
				if err != nil || got.Status != protocol.StatusReady {
					t.Fatalf("after %s: sandbox %+v, %v", after, got, err)
				}
				if strings.Contains(d.logs.String(), "sandbox died") {
					t.Fatalf("after %s the sandbox died and was restarted:\n%s", after, d.logs.String())
				}
			}
			for _, dir := range []string{"/dev/shm", "/tmp"} {
				if fs := strings.TrimSpace(mustRun(t, d.Client, sb.Name, "stat -f -c %T "+dir)); fs != "tmpfs" {
					t.Logf("%s is %s on %s: on disk, bounded by fs_capacity_bytes", dir, fs, rt)
					continue
				}
				_, errOut, code := run(t, d.Client, sb.Name, "dd if=/dev/zero of="+dir+"/fill bs=1M count=512")
				if code == 0 || !strings.Contains(errOut, "No space left on device") {
					t.Errorf("filling %s: exit %d, stderr %q; want ENOSPC", dir, code, errOut)
				}
				alive("filling " + dir)
				mustRun(t, d.Client, sb.Name, "rm -f "+dir+"/fill")
			}
			// The bomb's command may end in an error or an exit code; either
			// way it must be the only casualty.
			_, errOut, code := run(t, d.Client, sb.Name, "b(){ b|b& }; b; sleep 3; kill -9 0")
			t.Logf("fork bomb: exit %d, stderr %.200q", code, errOut)
			alive("a fork bomb")
		})
	}
}

// TestSandboxDeathIsExplained kills a gVisor sandbox the one way left from
// inside (a single system call committing far more than the host cgroup's
// headroom, see the gvisor driver's hostMemLimit) and checks that the
// command's error says the sandbox was killed for its memory limit, rather
// than the client reconnecting to the next instance and reporting
// CommandNotFound.
func TestSandboxDeathIsExplained(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "death", ref)
	sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.MemBytes = int64p(64 << 20) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "dd if=/dev/zero of=/dev/null bs=1G count=1", Shell: "/bin/sh"})
	if err == nil || !strings.Contains(err.Error(), "the sandbox stopped while the command ran") || !strings.Contains(err.Error(), "memory limit") {
		t.Fatalf("exec error %v, want the sandbox's death and its reason", err)
	}
	t.Logf("exec error: %v", err)
	if out := mustRun(t, d.Client, sb.Name, "echo restarted"); out != "restarted\n" {
		t.Fatalf("next exec: %q", out)
	}
}

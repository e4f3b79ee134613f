package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// testForkBomb forks sleepers inside a sandbox with limits l until fork
// fails, and checks that the bound is the driver's task bound (l.Tasks()),
// that the sandbox itself survives (same PID, its agent answers once the
// sleepers are gone) and that another sandbox is unaffected.
func testForkBomb(t *testing.T, env *Env, d runtime.Driver, l runtime.Limits) {
	s := env.Start(t, d, l, nil)
	ctx := context.Background()
	pid, err := d.PID(ctx, s.Spec.ID)
	if err != nil || pid == 0 {
		t.Fatalf("PID = %d, %v", pid, err)
	}
	// Fork sleepers until fork fails, recording progress with builtins
	// only; ash gives up at the first failed fork. The sleepers must
	// outlive the loop, which forks one every 5-10 ms under gVisor on a
	// busy host, for the count to be of tasks alive at once.
	tries, nap := 4*l.Tasks(), max(2, l.Tasks()/50)
	s.Exec(t, fmt.Sprintf("i=0; while [ $i -lt %d ]; do sleep %d & i=$((i+1)); echo $i > /tmp/n; done", tries, nap))
	// The sleepers hold the pids until they exit (and the loop may fork
	// more as they do): retry until the sandbox can fork again. The agent
	// itself may fail to fork the shell (EAGAIN, an error frame rather than
	// an exit code): that is retried too.
	// A command the agent cannot fork must say why.
	execWhenForkable := func(cmd string) string {
		for deadline := time.Now().Add(15 * time.Second); ; {
			var o bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			code, err := s.Client.Exec(ctx, protocol.ExecFrame{Command: cmd, Shell: "/bin/sh"}, &o, nil)
			cancel()
			if err == nil && code == 0 {
				return o.String()
			}
			var ee *agent.ExecError
			if errors.As(err, &ee) && !strings.Contains(ee.Message, "limit of processes and threads") {
				t.Errorf("command refused with %q, want the task limit named", ee.Message)
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox cannot run %q 15 s after the bomb: code %d, %v", cmd, code, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	n, _ := strconv.Atoi(strings.TrimSpace(execWhenForkable("cat /tmp/n")))
	t.Logf("forked %d sleepers before the task bound %d (PidsMax %d, MemBytes %d)", n, l.Tasks(), l.PidsMax, l.MemBytes)
	if n <= 0 || int64(n) >= l.Tasks() {
		t.Errorf("forked %d sleepers, want fewer than the task bound %d", n, l.Tasks())
	}
	if out := execWhenForkable("echo alive"); out != "alive\n" {
		t.Fatalf("agent after fork bomb: %q", out)
	}
	if after, err := d.PID(ctx, s.Spec.ID); err != nil || after != pid {
		t.Fatalf("sandbox PID %d before the bomb, %d (%v) after: the sandbox died", pid, after, err)
	}
	other := env.Start(t, d, l, nil)
	if out := other.MustExec(t, "echo ok"); out != "ok\n" {
		t.Fatalf("second sandbox: %q", out)
	}
}

// testTmpfsFill fills every memory-backed filesystem a command can write
// (/dev/shm, /tmp where it is a tmpfs, /dev) and checks that the command
// gets ENOSPC (or EROFS: gVisor's /dev is read-only) while the sandbox
// lives on: tmpfs
// pages are memory that no kill frees, so an unsized tmpfs lets one command
// exhaust the sandbox's memory and get the whole sandbox killed.
func testTmpfsFill(t *testing.T, env *Env, d runtime.Driver) {
	l := runtime.Limits{MemBytes: 128 << 20, PidsMax: 256}
	s := env.Start(t, d, l, nil)
	ctx := context.Background()
	pid, err := d.PID(ctx, s.Spec.ID)
	if err != nil || pid == 0 {
		t.Fatalf("PID = %d, %v", pid, err)
	}
	for _, dir := range []string{"/dev/shm", "/tmp", "/dev"} {
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			if fs := strings.TrimSpace(s.MustExec(t, "stat -f -c %T "+dir)); fs != "tmpfs" {
				t.Logf("%s is %s, not memory: bounded by the rootfs's capacity instead", dir, fs)
				return
			}
			// Twice the memory limit: without a size, this kills the sandbox.
			out, errOut, code := s.Exec(t, "dd if=/dev/zero of="+dir+"/fill bs=1M count=256")
			t.Logf("dd into %s: exit %d, %q %q", dir, code, out, errOut)
			if code == 0 {
				t.Errorf("writing 256 MiB into %s succeeded under a 128 MiB limit", dir)
			}
			if !strings.Contains(errOut, "No space left on device") && !strings.Contains(errOut, "Read-only file system") {
				t.Errorf("dd into %s: stderr %q, want ENOSPC or EROFS", dir, errOut)
			}
			used := s.MustExec(t, "du -k "+dir+"/fill 2>/dev/null | cut -f1; rm -f "+dir+"/fill")
			if kb, _ := strconv.ParseInt(strings.TrimSpace(used), 10, 64); kb<<10 > l.TmpfsBytes() {
				t.Errorf("%s held %d KiB, more than the tmpfs size %d", dir, kb, l.TmpfsBytes()>>10)
			}
			if out := s.MustExec(t, "echo alive"); out != "alive\n" {
				t.Fatalf("after filling %s: %q", dir, out)
			}
			if after, err := d.PID(ctx, s.Spec.ID); err != nil || after != pid {
				t.Fatalf("sandbox PID %d before, %d (%v) after filling %s: the sandbox died", pid, after, err, dir)
			}
		})
	}
}

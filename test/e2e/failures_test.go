package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// hostProcs returns the host pids whose command line holds every one of
// words (runsc puts the container id on its Sentry's and gofer's).
func hostProcs(words ...string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
		if containsAll(args, words) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func containsAll(args, words []string) bool {
	for _, w := range words {
		found := false
		for _, a := range args {
			if a == w || filepath.Base(a) == w {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// namespacePID1 is the host pid of PID 1 of namespace sandbox rid.
func namespacePID1(t *testing.T, rid string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/cubicle", rid, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		st, _ := os.ReadFile(filepath.Join("/proc", f, "status"))
		for _, l := range strings.Split(string(st), "\n") {
			if v, ok := strings.CutPrefix(l, "NSpid:"); ok && strings.HasSuffix(strings.TrimSpace(v), "\t1") {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("no PID 1 in cgroup of %s", rid)
	return 0
}

func killPID(t *testing.T, what string, pids []int) {
	t.Helper()
	if len(pids) != 1 {
		t.Fatalf("%s: want one process, found %v", what, pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s (%d): %v", what, pids[0], err)
	}
}

// stopData is a stopped event's data.
type stopData struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// waitStopEvent waits for a stopped event in sandbox name's record.
func waitStopEvent(t *testing.T, c *cubicle.Client, name string, within time.Duration) stopData {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		list, err := c.Audit(context.Background(), name, cubicle.AuditOptions{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Type == protocol.EventStopped {
				var d stopData
				if err := json.Unmarshal(e.Data, &d); err != nil {
					t.Fatal(err)
				}
				return d
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stopped event in %s's record %v after its process was killed", name, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSandboxProcessKilled kills, from outside, each process a sandbox
// lives on while an exec is pending in it: gVisor's Sentry (the runsc
// sandbox process), its gofer, the agent (PID 1, crashed by a SIGABRT
// and killed by a SIGKILL, both sent through runsc),
// and the namespace sandbox's PID 1. Each time the pending exec ends
// promptly with an error, the sandbox is marked stopped with the reason,
// start brings it back with its files, and a neighbour keeps running.
func TestSandboxProcessKilled(t *testing.T) {
	ref := testImage(t)
	type victim struct {
		runtime, name string
		kill          func(t *testing.T, d *daemon, rid string)
		cause         string // in the status message
	}
	// runscKill sends the agent (PID 1 inside the Sentry, no host
	// process of its own) sig through runsc.
	runscKill := func(sig string) func(t *testing.T, d *daemon, rid string) {
		return func(t *testing.T, d *daemon, rid string) {
			_, runsc := binaries(t)
			root := filepath.Join(d.dataDir, "runtime", "gvisor", "runsc")
			if out, err := exec.Command(runsc, "--root", root, "kill", rid, sig).CombinedOutput(); err != nil {
				t.Fatalf("runsc kill: %v %s", err, out)
			}
		}
	}
	for _, v := range []victim{
		{"gvisor", "sentry", func(t *testing.T, _ *daemon, rid string) {
			killPID(t, "sentry", hostProcs("runsc-sandbox", "boot", rid))
		}, "its Sentry (the runsc sandbox process) was killed"},
		{"gvisor", "gofer", func(t *testing.T, _ *daemon, rid string) {
			killPID(t, "gofer", hostProcs("runsc-gofer", "gofer", rid))
		}, "its gofer (the runsc process serving its files) died"},
		{"gvisor", "agent", runscKill("ABRT"), "its PID 1 (the agent) exited: exit status 2"},
		{"gvisor", "agent-kill9", runscKill("KILL"), "its PID 1 (the agent) was killed by signal 9"},
		{"namespace", "pid1", func(t *testing.T, _ *daemon, rid string) {
			killPID(t, "pid 1", []int{namespacePID1(t, rid)})
		}, "exited unexpectedly"},
	} {
		t.Run(v.runtime+"/"+v.name, func(t *testing.T) {
			ctx := context.Background()
			d := startDaemon(t, v.runtime, "")
			c := d.Client
			base := readySnapshot(t, c, "base", ref)
			sb := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "victim" })
			nb := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "neighbour" })
			mustRun(t, c, sb.Name, "echo kept > /root/kept")

			pending := make(chan error, 1)
			go func() {
				ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				code, err := c.Exec(ectx, sb.Name, cubicle.ExecRequest{Command: "echo started; sleep 100", Shell: "/bin/sh", Stdout: &bytes.Buffer{}})
				if err == nil {
					t.Logf("pending exec exited %d", code)
				}
				pending <- err
			}()
			time.Sleep(time.Second) // the exec is running
			t0 := time.Now()
			v.kill(t, d, strings.ReplaceAll(sb.ID, "-", ""))
			select {
			case err := <-pending:
				// It says why, and did not reconnect (which would start
				// the sandbox again and hear CommandNotFound).
				if err == nil || !strings.Contains(err.Error(), "the sandbox stopped while the command ran: sandbox exited unexpectedly") {
					t.Errorf("the pending exec returned %v, want the reason", err)
				}
				t.Logf("pending exec ended after %v: %v", time.Since(t0), err)
			case <-time.After(15 * time.Second):
				t.Fatal("the pending exec still hangs 15 s after the kill")
			}
			// The daemon records the stop and why.
			stop := waitStopEvent(t, c, sb.Name, 15*time.Second)
			if stop.Reason != protocol.StopCrash || !strings.Contains(stop.Message, v.cause) {
				t.Fatalf("stopped event %+v, want reason %s and %q", stop, protocol.StopCrash, v.cause)
			}
			t.Logf("stopped: %s", stop.Message)
			got, err := c.GetSandbox(ctx, sb.Name)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != protocol.StatusStopped || got.StatusMessage != stop.Message {
				t.Fatalf("after the kill: %s (%q)", got.Status, got.StatusMessage)
			}
			if out := mustRun(t, c, nb.Name, "echo alive"); out != "alive\n" {
				t.Fatalf("neighbour answers %q", out)
			}
			if err := c.StartSandbox(ctx, sb.Name); err != nil {
				t.Fatal(err)
			}
			if out := mustRun(t, c, sb.Name, "cat /root/kept"); out != "kept\n" {
				t.Fatalf("restarted sandbox sees %q", out)
			}
			if got, _ := c.GetSandbox(ctx, nb.Name); got == nil || got.Status != protocol.StatusReady {
				t.Fatalf("neighbour is %+v", got)
			}
		})
	}
}

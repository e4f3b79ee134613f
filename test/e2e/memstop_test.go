package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// memStopImage is the marker file of sandbox id's stop image: present
// once the image is complete.
func memStopImage(d *daemon, id string) string {
	return filepath.Join(d.dataDir, "cow", "snapshots", id+".mem", "agent-token")
}

// startMemServer starts the counter loop and busybox httpd on :8000
// serving /www, and returns httpd's PID (kept in /tmp, which is in the
// sandbox's memory).
func startMemServer(t *testing.T, c *cubicle.Client, name string) string {
	t.Helper()
	if err := c.WriteFile(context.Background(), name, "/www/index.html", strings.NewReader(indexHTML)); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, name, memCounterLoop+" setsid busybox httpd -f -p 8000 -h /www </dev/null >/dev/null 2>&1 & echo $! > /tmp/httpd.pid")
	time.Sleep(500 * time.Millisecond)
	return httpdPID(t, c, name)
}

func httpdPID(t *testing.T, c *cubicle.Client, name string) string {
	t.Helper()
	pid := strings.TrimSpace(mustRun(t, c, name, `p=$(cat /tmp/httpd.pid) && tr '\0' ' ' </proc/$p/cmdline | grep -q httpd && echo $p; true`))
	if pid == "" {
		t.Fatalf("%s: httpd is not running", name)
	}
	return pid
}

// stopPreserving stops name through the API and checks it kept its memory.
func stopPreserving(t *testing.T, d *daemon, sb *protocol.Sandbox) {
	t.Helper()
	if err := d.Client.StopSandbox(context.Background(), sb.Name); err != nil {
		t.Fatal(err)
	}
	wantMemoryKept(t, d, sb)
}

func wantMemoryKept(t *testing.T, d *daemon, sb *protocol.Sandbox) {
	t.Helper()
	got, err := d.Client.GetSandbox(context.Background(), sb.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != protocol.StatusStopped || !strings.Contains(got.StatusMessage, "memory preserved") {
		t.Fatalf("after the stop: %s (%s)", got.Status, got.StatusMessage)
	}
	if _, err := os.Stat(memStopImage(d, sb.ID)); err != nil {
		t.Fatalf("no complete memory image: %v", err)
	}
}

// wantResumed checks the counter goes on from at least from and the same
// httpd (pid) still serves, reached through the service URL at base.
func wantResumed(t *testing.T, d *daemon, name string, from int, pid, base, token string) int {
	t.Helper()
	wantCounting(t, d.Client, name, from)
	if got := httpdPID(t, d.Client, name); got != pid {
		t.Fatalf("httpd is pid %s, was %s: it did not survive", got, pid)
	}
	if base != "" {
		resp, body := fetch(t, http.DefaultClient, http.MethodGet, base+"/index.html", http.Header{protocol.ServiceTokenHeader: {token}})
		if resp.StatusCode != 200 || body != indexHTML {
			t.Fatalf("service after the restore: %d %q", resp.StatusCode, body)
		}
	}
	return memCounter(t, d.Client, name)
}

// TestMemoryPreservingStop: on gvisor, with preserve_memory_on_stop a
// stop — explicit or idle — checkpoints the sandbox, and the next start —
// explicit, or a service-URL request's wake-up — restores it, so a
// counter loop goes on from where it was and the same busybox httpd
// answers; the image survives kill -9 of the daemon; restore_memory false
// boots cold and discards it, true without one is a 409. The namespace
// runtime answers 422 naming the field.
func TestMemoryPreservingStop(t *testing.T) {
	ref := testImage(t)
	ctx := context.Background()
	t.Run("namespace", func(t *testing.T) {
		d := startDaemon(t, "namespace", "")
		st, body := call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"name": "x", "preserve_memory_on_stop": true})
		pydantic(t, st, body, "preserve_memory_on_stop")
	})
	t.Run("gvisor", func(t *testing.T) {
		d := startFastTTLDaemon(t, "gvisor")
		c := d.Client
		base := readySnapshot(t, c, "base", ref)
		sb := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) {
			r.Name, r.PreserveMemoryOnStop = "keep", ptrBool(true)
		})
		if !sb.PreserveMemoryOnStop {
			t.Fatal("the sandbox JSON does not say preserve_memory_on_stop")
		}
		pid := startMemServer(t, c, sb.Name)
		su, err := c.ServiceURL(ctx, sb.Name, protocol.ServiceURLRequest{Port: 8000})
		if err != nil {
			t.Fatal(err)
		}
		svc := d.Endpoint + "/s/" + sb.ID + "/8000"
		waitServing(t, svc+"/", su.Token)
		at := memCounter(t, c, sb.Name)

		// Explicit stop and start.
		stopPreserving(t, d, sb)
		if err := c.StartSandbox(ctx, sb.Name); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(memStopImage(d, sb.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the image outlived its restore: %v", err)
		}
		at = wantResumed(t, d, sb.Name, at, pid, svc, su.Token)

		// Idle stop, woken by a service-URL request.
		patchSandbox(t, d, sb.Name, map[string]any{"idle_ttl_seconds": 2})
		p3WaitStatus(t, d, sb.Name, protocol.StatusStopped, 10*time.Second)
		wantMemoryKept(t, d, sb)
		if !strings.Contains(mustStatusMessage(t, d, sb.Name), "idle_ttl_seconds") {
			t.Fatal("the idle stop's message does not say why")
		}
		resp, body := fetch(t, http.DefaultClient, http.MethodGet, svc+"/index.html", http.Header{protocol.ServiceTokenHeader: {su.Token}})
		if resp.StatusCode != 200 || body != indexHTML {
			t.Fatalf("service URL after the idle stop: %d %q", resp.StatusCode, body)
		}
		patchSandbox(t, d, sb.Name, map[string]any{"idle_ttl_seconds": 0})
		at = wantResumed(t, d, sb.Name, at, pid, "", "")

		// kill -9 of the daemon while the sandbox is stopped.
		stopPreserving(t, d, sb)
		d.kill9()
		d.restart()
		if err := c.StartSandbox(ctx, sb.Name); err != nil {
			t.Fatal(err)
		}
		wantResumed(t, d, sb.Name, at, pid, svc, su.Token)

		// restore_memory: false boots cold and discards the image.
		stopPreserving(t, d, sb)
		st, out := call(t, d, "POST", "/v2/sandboxes/boxes/"+sb.Name+"/start", map[string]any{"restore_memory": false})
		if st != 200 || out["status"] != protocol.StatusReady {
			t.Fatalf("cold start: %d %v", st, out)
		}
		if got := mustRun(t, c, sb.Name, "test -e /tmp/c && echo counter; test -e /tmp/httpd.pid && echo httpd; true"); got != "" {
			t.Fatalf("a cold boot kept processes: %q", got)
		}
		if _, err := os.Stat(memStopImage(d, sb.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("restore_memory: false kept the image: %v", err)
		}
		// restore_memory: true without an image is a 409 that says why.
		if out := patchSandbox(t, d, sb.Name, map[string]any{"preserve_memory_on_stop": false}); out["preserve_memory_on_stop"] != false {
			t.Fatalf("PATCH answered %v", out)
		}
		if err := c.StopSandbox(ctx, sb.Name); err != nil {
			t.Fatal(err)
		}
		st, out = call(t, d, "POST", "/v2/sandboxes/boxes/"+sb.Name+"/start?restore_memory=true", nil)
		if st != 409 || !strings.Contains(strings.ToLower(jsonString(out)), "no memory image") {
			t.Fatalf("restore_memory: true without an image: %d %v", st, out)
		}
	})
}

func ptrBool(v bool) *bool { return &v }

// patchSandbox PATCHes sandbox name with body and returns the answer.
func patchSandbox(t *testing.T, d *daemon, name string, body map[string]any) map[string]any {
	t.Helper()
	st, out := call(t, d, "PATCH", "/v2/sandboxes/boxes/"+name, body)
	if st != 200 {
		t.Fatalf("PATCH %v: %d %v", body, st, out)
	}
	return out
}

func mustStatusMessage(t *testing.T, d *daemon, name string) string {
	t.Helper()
	st, err := d.Client.SandboxStatus(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return st.StatusMessage
}

// jsonString flattens an error body for a substring check.
func jsonString(v map[string]any) string {
	var b strings.Builder
	for k, x := range v {
		b.WriteString(k + "=")
		if m, ok := x.(map[string]any); ok {
			b.WriteString(jsonString(m))
		} else if s, ok := x.(string); ok {
			b.WriteString(s)
		}
		b.WriteString(" ")
	}
	return b.String()
}

// TestMemoryPreservingStopLatency reports, on gvisor, the median of 3
// memory-preserving stops and of the starts after them (start request to
// the first output of a command) for an idle sandbox, and for one holding
// 200 MiB in memory; the idle round trip is bounded at 400 ms.
func TestMemoryPreservingStopLatency(t *testing.T) {
	ref := testImage(t)
	ctx := context.Background()
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	base := readySnapshot(t, c, "base", ref)
	for _, tc := range []struct {
		name, setup string
		bound       time.Duration
	}{
		{"idle", "", 400 * time.Millisecond},
		// 200 MiB of non-zero pages in /tmp, gVisor's own tmpfs, which
		// lives in the sandbox's memory (a bash variable that size takes
		// gVisor 10-20 s to build), and a process that must survive.
		{"200MiB", `head -c 209715200 /dev/zero | tr "\000" a > /tmp/blob && echo held > /tmp/held &&
			(setsid sleep 100000 </dev/null >/dev/null 2>&1 &)`, 0},
	} {
		sb := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) {
			r.Name, r.PreserveMemoryOnStop = "lat-"+strings.ToLower(tc.name), ptrBool(true)
		})
		if tc.setup != "" {
			mustRun(t, c, sb.Name, tc.setup)
			t.Logf("%s: memory in use: %s", tc.name, strings.TrimSpace(mustRun(t, c, sb.Name, "free -m | grep Mem:")))
		}
		var stops, starts, rounds []float64
		for i := 0; i < 3; i++ {
			t0 := time.Now()
			stopPreserving(t, d, sb)
			stop := time.Since(t0)
			t1 := time.Now()
			if err := c.StartSandbox(ctx, sb.Name); err != nil {
				t.Fatal(err)
			}
			if out := mustRun(t, c, sb.Name, "echo up"); out != "up\n" {
				t.Fatalf("first output %q", out)
			}
			start := time.Since(t1)
			stops, starts, rounds = append(stops, ms(stop)), append(starts, ms(start)), append(rounds, ms(stop+start))
			if tc.setup != "" {
				if got := mustRun(t, c, sb.Name, "cat /tmp/held; pidof sleep >/dev/null && echo alive; wc -c </tmp/blob; tr -d a </tmp/blob | wc -c"); got != "held\nalive\n209715200\n0\n" {
					t.Fatalf("the 200 MiB and the process did not survive: %q", got)
				}
			}
		}
		t.Logf("%s: memory-preserving stop median %.0f ms %v; start→first output median %.0f ms %v; stop→start→first output median %.0f ms",
			tc.name, median(stops), stops, median(starts), starts, median(rounds))
		if tc.bound > 0 && median(rounds) > ms(tc.bound) {
			t.Errorf("%s: stop→start→first output median %.0f ms, over %v", tc.name, median(rounds), tc.bound)
		}
	}
}

package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/google/uuid"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// startFastTTLDaemon starts a daemon whose TTLs may be any whole number of
// seconds and are checked every 200 ms (the flags' environment fallbacks
// reach the daemon through the harness, which passes os.Environ()).
func startFastTTLDaemon(t *testing.T, rt string) *daemon {
	t.Setenv("CUBICLE_REAP_INTERVAL", "200ms")
	t.Setenv("CUBICLE_TTL_GRANULARITY", "1s")
	return startDaemon(t, rt, "")
}

// p3WaitStatus polls the list (which is not activity) until name has
// status want, failing after d.
func p3WaitStatus(t *testing.T, dm *daemon, name, want string, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, msg, found := p3Status(t, dm, name)
		if want == "" && !found || found && st == want {
			return msg
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s: status %q (found %v) after %v, want %q", name, st, found, d, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// p3StaysReady fails if name leaves ready within d (checked via the list).
func p3StaysReady(t *testing.T, dm *daemon, name string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if st, msg, _ := p3Status(t, dm, name); st != protocol.StatusReady {
			t.Fatalf("sandbox %s is %s (%s); it should have stayed ready", name, st, msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestIdleTTLAndDeleteAfterStop(t *testing.T) {
	ref := testImage(t)
	d := startFastTTLDaemon(t, "gvisor")
	sn := readySnapshot(t, d.Client, "ttl", ref)
	ctx := context.Background()
	ttl := func(idle, das int64) func(*protocol.CreateSandboxRequest) {
		return func(r *protocol.CreateSandboxRequest) { r.IdleTTLSeconds, r.DeleteAfterStopSeconds = &idle, &das }
	}

	t.Run("idle sandbox stops and wakes on use", func(t *testing.T) {
		sb := newSandbox(t, d.Client, sn.ID, ttl(2, 0))
		mustRun(t, d.Client, sb.Name, "echo hi > /root/f")
		start := time.Now()
		msg := p3WaitStatus(t, d, sb.Name, protocol.StatusStopped, 8*time.Second)
		if took := time.Since(start); took < 1500*time.Millisecond {
			t.Fatalf("stopped after %v, before its 2 s idle TTL", took)
		}
		if !strings.Contains(msg, "idle_ttl_seconds") {
			t.Fatalf("status message %q does not say why", msg)
		}
		if out := mustRun(t, d.Client, sb.Name, "cat /root/f"); out != "hi\n" {
			t.Fatalf("after wake: %q", out)
		}
		p3WaitStatus(t, d, sb.Name, protocol.StatusReady, time.Second)
	})

	t.Run("API calls and exec keep it alive", func(t *testing.T) {
		sb := newSandbox(t, d.Client, sn.ID, ttl(2, 0))
		for i := 0; i < 5; i++ { // 5 s of activity, each gap under the TTL
			time.Sleep(time.Second)
			if i%2 == 0 {
				mustRun(t, d.Client, sb.Name, "true")
			} else if _, err := d.Client.GetSandbox(ctx, sb.Name); err != nil {
				t.Fatal(err)
			}
			if st, msg, _ := p3Status(t, d, sb.Name); st != protocol.StatusReady {
				t.Fatalf("stopped while in use: %s %s", st, msg)
			}
		}
	})

	t.Run("attached silent command keeps it alive", func(t *testing.T) {
		sb := newSandbox(t, d.Client, sn.ID, ttl(2, 0))
		done := make(chan string, 1)
		go func() {
			out, _, _ := run(t, d.Client, sb.Name, "sleep 5; echo done")
			done <- out
		}()
		p3StaysReady(t, d, sb.Name, 4500*time.Millisecond)
		if out := <-done; out != "done\n" {
			t.Fatalf("long command output %q (cut short by the idle stop?)", out)
		}
	})

	t.Run("detached command keeps it alive", func(t *testing.T) {
		sb := newSandbox(t, d.Client, sn.ID, ttl(2, 0))
		// wait:false in the official client: execute, read started, leave.
		wsURL := "ws" + strings.TrimPrefix(sb.DataplaneURL, "http") + "/execute/ws"
		c, _, err := websocket.Dial(ctx, wsURL, &websocket.DialOptions{HTTPHeader: http.Header{"X-Api-Key": {testKey}}})
		if err != nil {
			t.Fatal(err)
		}
		id := uuid.NewString()
		if err := wsjson.Write(ctx, c, protocol.ExecFrame{Type: protocol.FrameExecute, Command: "sleep 4; echo done > /root/detached", Shell: "/bin/sh", CommandID: id, CloseStdin: true}); err != nil {
			t.Fatal(err)
		}
		var f protocol.ExecFrame
		if err := wsjson.Read(ctx, c, &f); err != nil || f.Type != protocol.FrameStarted {
			t.Fatalf("first frame %+v %v", f, err)
		}
		c.CloseNow()
		time.Sleep(3500 * time.Millisecond)
		if st, msg, _ := p3Status(t, d, sb.Name); st != protocol.StatusReady {
			t.Fatalf("stopped while a detached command ran: %s %s", st, msg)
		}
		// Once the command is over the idle clock runs again.
		p3WaitStatus(t, d, sb.Name, protocol.StatusStopped, 8*time.Second)
		if out := mustRun(t, d.Client, sb.Name, "cat /root/detached"); out != "done\n" {
			t.Fatalf("detached command did not finish: %q", out)
		}
	})

	t.Run("delete after stop", func(t *testing.T) {
		sb := newSandbox(t, d.Client, sn.ID, ttl(0, 2))
		keep := newSandbox(t, d.Client, sn.ID, ttl(0, 0))
		for _, n := range []string{sb.Name, keep.Name} {
			if err := d.Client.StopSandbox(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		stopped := time.Now()
		p3WaitStatus(t, d, sb.Name, "", 8*time.Second)
		if took := time.Since(stopped); took < 1500*time.Millisecond {
			t.Fatalf("deleted %v after stop, before delete_after_stop_seconds=2", took)
		}
		st, body := call(t, d, "GET", "/v2/sandboxes/boxes/"+sb.Name, nil)
		structured(t, st, 404, body, "NotFound")
		if st, _, found := p3Status(t, d, keep.Name); !found || st != protocol.StatusStopped {
			t.Fatalf("sandbox with delete_after_stop_seconds=0 was touched: %q found=%v", st, found)
		}
	})

	t.Run("TTL validation follows the granularity", func(t *testing.T) {
		st, body := call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": sn.ID, "idle_ttl_seconds": -1})
		pydantic(t, st, body, "idle_ttl_seconds")
	})
}

// TestIdleTTLSurvivesRestart checks a daemon restart neither resets the
// idle clock (the sandbox stops when its persisted idle time runs out, not
// a full TTL after the restart) nor fires it at once.
func TestIdleTTLSurvivesRestart(t *testing.T) {
	ref := testImage(t)
	d := startFastTTLDaemon(t, "namespace")
	sn := readySnapshot(t, d.Client, "ttl-restart", ref)
	idle := int64(8)
	sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.IdleTTLSeconds = &idle })
	mustRun(t, d.Client, sb.Name, "true")
	lastUse := time.Now()
	time.Sleep(4 * time.Second) // half the TTL idle, persisted by the reaper
	d.kill9()
	d.restart()
	restarted := time.Now()
	p3StaysReady(t, d, sb.Name, time.Second) // not fired at once
	p3WaitStatus(t, d, sb.Name, protocol.StatusStopped, 10*time.Second)
	stoppedAfter := time.Since(lastUse)
	if since := time.Since(restarted); since > 6500*time.Millisecond {
		t.Fatalf("stopped %v after the restart: the restart reset the idle clock (TTL 8 s, 4+ s already idle)", since)
	}
	if stoppedAfter < 7*time.Second {
		t.Fatalf("stopped %v after the last use, before its 8 s TTL", stoppedAfter)
	}
}

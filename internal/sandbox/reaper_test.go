package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// backdate makes sandbox id look idle since d ago.
func (e *env) backdate(id string, d time.Duration) {
	e.m.mu.Lock()
	defer e.m.mu.Unlock()
	e.m.boxLocked(id).act.last = time.Now().Add(-d)
}

func TestReaperStopsIdleSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "idle", IdleTTLSeconds: ptr(int64(2))})
	if err != nil {
		t.Fatal(err)
	}
	e.m.Reap(context.Background())
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatalf("a fresh sandbox was reaped: %s", got.Status)
	}

	// An open request keeps it however old its last activity.
	c, err := e.m.Dataplane(ctx, sb.ID, authz.Exec)
	if err != nil {
		t.Fatal(err)
	}
	e.backdate(sb.ID, time.Minute)
	e.m.Reap(context.Background())
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatal("a sandbox with an open request was reaped")
	}
	c.Release()

	// A command the agent reports running counts as activity.
	e.driver.Agent(runtimeID(sb.ID)).SetActivity(agent.Activity{Running: 1, Sessions: 1})
	e.backdate(sb.ID, time.Minute)
	e.m.Reap(context.Background())
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatal("a sandbox running a detached command was reaped")
	}
	// The command ending is a change, so activity too; after that, idle.
	e.driver.Agent(runtimeID(sb.ID)).SetActivity(agent.Activity{Sessions: 1})
	e.backdate(sb.ID, time.Minute)
	e.m.Reap(context.Background())
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatal("a sandbox whose command just ended was reaped")
	}
	e.backdate(sb.ID, time.Minute)
	e.m.Reap(context.Background())
	got := e.get(t, sb.ID)
	if got.Status != protocol.StatusStopped || !strings.Contains(got.StatusMessage, "idle_ttl_seconds=2") {
		t.Fatalf("idle sandbox: %s %q", got.Status, got.StatusMessage)
	}
	if got.LastActiveAt == nil {
		t.Fatal("the reaper did not persist activity")
	}
	// The next request starts it again.
	c, err = e.m.Dataplane(ctx, sb.ID, authz.Exec)
	if err != nil {
		t.Fatalf("request after an idle stop: %v", err)
	}
	c.Release()
}

// TestReaperPollsOnlyWhenDue: the agent is asked about its commands only
// once the daemon's own clock says the sandbox is due to stop (an idle
// sandbox is never woken for it), and its changed_ms_ago moves the idle
// clock back to when a command last started, wrote or finished.
func TestReaperPollsOnlyWhenDue(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "lazy", IdleTTLSeconds: ptr(int64(60))})
	if err != nil {
		t.Fatal(err)
	}
	fake := e.driver.Agent(runtimeID(sb.ID))
	for range 3 {
		e.m.Reap(context.Background())
	}
	if n := fake.ActivityPolls(); n != 0 {
		t.Fatalf("a sandbox not yet due was polled %d times", n)
	}

	// Due by the API clock, but a detached command wrote output 10 s ago:
	// kept, and the clock now says 10 s, so the next pass does not poll.
	ago := int64(10_000)
	fake.SetActivity(agent.Activity{Sessions: 1, OutputBytes: 5, ChangedMsAgo: &ago})
	e.backdate(sb.ID, 2*time.Minute)
	e.m.Reap(context.Background())
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatal("a sandbox whose command wrote 10 s ago was reaped")
	}
	if idle, _ := e.m.idleFor(sb.ID, time.Now(), time.Time{}); idle < 9*time.Second || idle > 12*time.Second {
		t.Fatalf("idle clock after the poll: %v, want about 10 s", idle)
	}
	e.m.Reap(context.Background())
	if n := fake.ActivityPolls(); n != 1 {
		t.Fatalf("polls: %d, want 1", n)
	}

	// The last change is older than the TTL: stopped.
	ago = int64(90_000)
	fake.SetActivity(agent.Activity{Sessions: 1, OutputBytes: 5, ChangedMsAgo: &ago})
	e.backdate(sb.ID, 2*time.Minute)
	e.m.Reap(context.Background())
	if got := e.get(t, sb.ID); got.Status != protocol.StatusStopped {
		t.Fatalf("a sandbox idle past its TTL by the agent's clock too: %s", got.Status)
	}
}

func TestReaperDeletesAfterStopTTL(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "old", DeleteAfterStopSeconds: ptr(int64(1))})
	if err != nil {
		t.Fatal(err)
	}
	keep := e.create(t, member, "keep")
	for _, n := range []string{"old", "keep"} {
		if _, err := e.m.StopSandbox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1100 * time.Millisecond)
	e.m.Reap(context.Background())
	if _, err := e.st.GetSandboxByID(context.Background(), sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("stopped sandbox past its delete_after_stop_seconds: %v", err)
	}
	if got := e.get(t, keep.ID); got.Status != protocol.StatusStopped {
		t.Fatalf("a sandbox with the default TTL was touched: %s", got.Status)
	}
}

func TestReaperLoopEndsWithClose(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ReapInterval = 10 * time.Millisecond })
	sb := e.create(t, member, "r")
	e.m.StartReaper(context.Background())
	e.m.touch(sb.ID)
	eventually(t, "an activity flush", func() bool { return e.get(t, sb.ID).LastActiveAt != nil })
	e.m.Close() // returns only once the reaper has ended (goleak checks the rest)
}

func TestFlushForgetsDeletedSandboxes(t *testing.T) {
	e := newEnv(t)
	e.m.touch("no-such-sandbox")
	e.m.flushActivity(context.Background(), []*store.Sandbox{})
	e.m.mu.Lock()
	_, ok := e.m.boxes["no-such-sandbox"]
	e.m.mu.Unlock()
	if ok {
		t.Fatal("the box of a sandbox with no record survived a flush")
	}
}

func TestRecover(t *testing.T) {
	e := newEnv(t)
	alive := e.create(t, member, "alive")
	dead := e.create(t, member, "dead")
	now := time.Now().UTC()
	half := &store.Sandbox{ID: "00000000-0000-0000-0000-0000000000b1", WorkspaceID: workspace, CreatedBy: member.User, Name: "half",
		Status: string(Provisioning), SnapshotID: e.snap.ID, Token: "t", CreatedAt: now, UpdatedAt: now}
	dying := &store.Sandbox{ID: "00000000-0000-0000-0000-0000000000b2", WorkspaceID: workspace, CreatedBy: member.User, Name: "dying",
		Status: string(Deleting), SnapshotID: e.snap.ID, Token: "t", CreatedAt: now, UpdatedAt: now}
	for _, sb := range []*store.Sandbox{half, dying} {
		if err := e.st.CreateSandbox(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
	}
	e.m.Close()
	e.driver.Stop(context.Background(), runtimeID(dead.ID)) // gone while the daemon was down
	e.reopen(t)

	if c, _ := e.m.instance(alive.ID); c == nil || e.get(t, alive.ID).Status != protocol.StatusReady {
		t.Fatal("a running sandbox was not re-adopted")
	}
	if got := e.get(t, dead.ID); got.Status != protocol.StatusStopped || !strings.Contains(got.StatusMessage, "daemon restart") {
		t.Fatalf("a sandbox gone while the daemon was down: %s %q", got.Status, got.StatusMessage)
	}
	if got := e.get(t, half.ID); got.Status != protocol.StatusFailed {
		t.Fatalf("an interrupted boot: %s", got.Status)
	}
	if _, err := e.st.GetSandboxByID(context.Background(), dying.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("an interrupted delete was not finished: %v", err)
	}
	// The re-adopted instance is watched again.
	e.driver.Kill(runtimeID(alive.ID))
	eventually(t, "the watcher", func() bool { return e.get(t, alive.ID).Status == protocol.StatusStopped })
}

// TestRecoverInterruptedStartAndCapture: a daemon that died during a
// start (instance up, record still stopped) or a capture (instance
// paused) leaves host state its records do not describe. After the
// restart the stopped one's instance, endpoint and mount are gone (its
// files kept), and the paused one runs again and answers.
func TestRecoverInterruptedStartAndCapture(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	starting := e.create(t, member, "starting")
	paused := e.create(t, member, "paused")
	srid, prid := runtimeID(starting.ID), runtimeID(paused.ID)
	if err := os.WriteFile(filepath.Join(e.storage.UpperDir(srid), "kept.txt"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.m.Close()
	// What the crashed start recorded: stopped, with its instance up.
	sb := e.get(t, starting.ID)
	sb.Status = string(Stopped)
	if err := e.st.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := e.driver.Pause(ctx, prid); err != nil {
		t.Fatal(err)
	}
	e.reopen(t)

	if running, _ := e.driver.Running(ctx, srid); running {
		t.Error("the interrupted start's instance still runs")
	}
	if _, err := e.net.Lookup(ctx, srid); err == nil {
		t.Error("the interrupted start's endpoint is still up")
	}
	if e.storage.Mounted(srid) {
		t.Error("the interrupted start's rootfs is still mounted")
	}
	if b, err := os.ReadFile(filepath.Join(e.storage.UpperDir(srid), "kept.txt")); err != nil || string(b) != "kept" {
		t.Errorf("the stopped sandbox's files: %q %v", b, err)
	}
	if e.driver.Paused(prid) {
		t.Error("the sandbox paused by the interrupted capture is still paused")
	}
	if c, _ := e.m.instance(paused.ID); c == nil || e.get(t, paused.ID).Status != protocol.StatusReady {
		t.Error("the sandbox paused by the interrupted capture was not re-adopted")
	}
	if got := e.get(t, starting.ID); got.Status != protocol.StatusStopped {
		t.Errorf("the interrupted start's record: %s", got.Status)
	}
}

package sandbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Bug 1: a boot that hits its timeout used to write its failure record on
// the expired context; the write failed and the sandbox stayed
// provisioning until the daemon restarted.
func TestBootTimeoutIsRecordedAsFailed(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Limits.BootTimeout = 150 * time.Millisecond })
	e.driver.StartHook = func(ctx context.Context, _ runtime.Spec) error {
		<-ctx.Done() // a runtime that hangs until the boot timeout
		return ctx.Err()
	}
	sb, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "slow"})
	if err == nil {
		t.Fatal("create of a sandbox whose runtime hangs succeeded")
	}
	got := e.get(t, sb.ID)
	if got.Status != protocol.StatusFailed || !strings.Contains(got.StatusMessage, "deadline") {
		t.Fatalf("after a boot timeout: status %q message %q, want failed with the timeout", got.Status, got.StatusMessage)
	}
	if e.driver.Instances() != 0 || e.net.Endpoints() != 0 || e.storage.Mounted(runtimeID(sb.ID)) {
		t.Fatal("a timed-out boot left its instance, network or mount behind")
	}
}

// Bug 1, second form: a client that goes away during POST /start of a
// failed sandbox cancelled the boot and its failure record alike.
func TestStartAbandonedByClientIsRecorded(t *testing.T) {
	e := newEnv(t)
	e.driver.StartHook = func(context.Context, runtime.Spec) error { return fmt.Errorf("image is broken") }
	sb, _ := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "broken"})
	if got := e.get(t, sb.ID); got.Status != protocol.StatusFailed {
		t.Fatalf("status %s, want failed", got.Status)
	}
	started := make(chan struct{})
	e.driver.StartHook = func(ctx context.Context, _ runtime.Spec) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}
	ctx, cancel := context.WithCancel(as(member))
	go func() { <-started; cancel() }()
	if _, err := e.m.StartSandbox(ctx, sb.Name); err == nil {
		t.Fatal("start cancelled by its client succeeded")
	}
	if got := e.get(t, sb.ID); got.Status != protocol.StatusFailed {
		t.Fatalf("after the client left during start: status %s, want failed (never stuck provisioning)", got.Status)
	}
}

// Bug 2: claimIdle checked idleness and detached the agent in two critical
// sections, so a request could acquire the sandbox and take its agent in
// between and then have it closed under it by the reaper. The test forces
// that interleaving: it puts m.mu in starvation mode (FIFO hand-off) with
// the reaper's claim queued first and a request second, so the request runs
// right after the claim's first critical section. A request that got an
// instance must keep it.
func TestClaimIdleNeverDetachesAnAcquiredInstance(t *testing.T) {
	for round := range 40 {
		m := &Manager{boxes: map[string]*box{}}
		const id = "sb"
		m.setAgent(id, agent.NewClient("127.0.0.1:1", "t"))
		m.mu.Lock()
		claimed := make(chan bool, 1)
		go func() { claimed <- m.claimIdle(id, time.Now().Add(time.Hour)) }()
		time.Sleep(10 * time.Millisecond) // the claim waits on m.mu
		m.mu.Unlock()
		m.mu.Lock() // usually wins against the woken claim, which then starves
		type got struct {
			release func()
			c       *agent.Client
		}
		took := make(chan got, 1)
		go func() {
			release, c, _ := m.acquireInstance(id)
			took <- got{release, c}
		}()
		time.Sleep(10 * time.Millisecond) // the request queues behind the claim
		m.mu.Unlock()
		r := <-took
		<-claimed
		if cur, _ := m.instance(id); r.c != nil && cur != r.c {
			t.Fatalf("round %d: the reaper detached the instance a request had acquired", round)
		}
		r.release()
	}
}

// Bug 3: the creator filter ran after the store paged, so a member who
// owns the last 10 of 60 sandboxes got an empty first page and no cursor.
func TestMemberListPagesAreFull(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	base := time.Now().UTC().Add(-time.Hour)
	for i := range 60 {
		who := "alice"
		if i >= 50 {
			who = member.User
		}
		sb := &store.Sandbox{ID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), WorkspaceID: workspace, CreatedBy: who,
			Name: fmt.Sprintf("sb-%02d", i), Status: protocol.StatusStopped, SnapshotID: e.snap.ID, Token: "t",
			CreatedAt: base.Add(time.Duration(i) * time.Second), UpdatedAt: base}
		if err := e.st.CreateSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	page, err := e.m.ListSandboxes(as(member), store.ListOptions{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(page) != 10 {
		t.Fatalf("member's first page has %d items, want 10", len(page))
	}
	for _, sb := range page {
		if sb.CreatedBy != member.User {
			t.Fatalf("member sees %s's sandbox %s", sb.CreatedBy, sb.Name)
		}
	}
	if rest, _ := e.m.ListSandboxes(as(member), store.ListOptions{Limit: 10, Offset: 10}); len(rest) != 0 {
		t.Fatalf("member's second page has %d items, want 0", len(rest))
	}
	if all, _ := e.m.ListSandboxes(as(admin), store.ListOptions{Limit: 100}); len(all) != 60 {
		t.Fatalf("admin sees %d sandboxes, want 60", len(all))
	}
}

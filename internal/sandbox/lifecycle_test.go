package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestCreateStopStartDelete(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb := e.create(t, member, "box-1")
	rid := runtimeID(sb.ID)
	spec, ok := e.driver.Spec(rid)
	if !ok {
		t.Fatal("ready sandbox has no running instance")
	}
	if spec.Hostname != "box-1" || spec.Limits.MemBytes != DefaultLimits.DefaultMemBytes || spec.Limits.MilliCPUs != DefaultLimits.DefaultVCPUs*1000 {
		t.Fatalf("instance spec: hostname %q limits %+v", spec.Hostname, spec.Limits)
	}
	if rec := e.get(t, sb.ID); rec.Token != spec.Token || e.driver.Agent(rid).Token() != spec.Token {
		t.Fatal("the recorded agent token is not the instance's")
	}
	firstToken := spec.Token

	stopped, err := e.m.StopSandbox(ctx, "box-1")
	if err != nil || stopped.Status != protocol.StatusStopped || stopped.StoppedAt == nil {
		t.Fatalf("stop: %v %+v", err, stopped)
	}
	if e.driver.Instances() != 0 || e.net.Endpoints() != 0 || e.storage.Mounted(rid) || !e.storage.Exists(rid) {
		t.Fatal("stop must end the instance and network, unmount and keep the files")
	}
	if c, _ := e.m.instance(sb.ID); c != nil {
		t.Fatal("a stopped sandbox still has an agent")
	}
	if again, err := e.m.StopSandbox(ctx, "box-1"); err != nil || again.Status != protocol.StatusStopped {
		t.Fatalf("stopping a stopped sandbox: %v", err)
	}

	started, err := e.m.StartSandbox(ctx, sb.ID) // by id works too
	if err != nil || started.Status != protocol.StatusReady || started.StoppedAt != nil {
		t.Fatalf("start: %v %+v", err, started)
	}
	spec, _ = e.driver.Spec(rid)
	if spec.Token == firstToken {
		t.Fatal("a restart reused the previous instance's agent token")
	}
	if _, err := e.m.StartSandbox(ctx, "box-1"); err != nil {
		t.Fatalf("starting a ready sandbox: %v", err)
	}

	if err := e.m.DeleteSandbox(ctx, "box-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GetSandboxByID(context.Background(), sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("record after delete: %v", err)
	}
	if e.storage.Exists(rid) || e.driver.Instances() != 0 || e.net.Endpoints() != 0 {
		t.Fatal("delete left data, an instance or a network behind")
	}
	e.m.mu.Lock()
	n := len(e.m.boxes)
	e.m.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d boxes left after the only sandbox was deleted", n)
	}
}

func TestVisibility(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, member, "mine")
	for _, call := range []func() error{
		func() error { _, err := e.m.GetSandbox(as(other), "mine"); return err },
		func() error { _, err := e.m.StopSandbox(as(other), "mine"); return err },
		func() error { return e.m.DeleteSandbox(as(other), sb.ID) },
		func() error { _, err := e.m.Dataplane(as(other), sb.ID, authz.Exec); return err },
		func() error {
			_, err := e.m.UpdateSandbox(as(other), "mine", protocol.UpdateSandboxRequest{Name: ptr("x")})
			return err
		},
	} {
		if err := call(); !errdefs.IsNotFound(err) {
			t.Fatalf("another member's call on my sandbox: %v, want not found", err)
		}
	}
	if _, err := e.m.GetSandbox(as(admin), "mine"); err != nil {
		t.Fatalf("admin get: %v", err)
	}
	if _, err := e.m.GetSandbox(context.Background(), "mine"); err == nil {
		t.Fatal("a call without a principal succeeded")
	}
	if list, _ := e.m.ListSandboxes(as(other), store.ListOptions{}); len(list) != 0 {
		t.Fatalf("another member lists %d sandboxes", len(list))
	}
	// A signed link acts as the creator, within its workspace only.
	if _, err := e.m.GrantDataplane(context.Background(), "other-ws", sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("grant from another workspace: %v", err)
	}
	c, err := e.m.GrantDataplane(context.Background(), workspace, "mine")
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
}

func TestStateGuards(t *testing.T) {
	e := newEnv(t)
	block, entered := make(chan struct{}), make(chan struct{}, 1)
	e.driver.StartHook = func(ctx context.Context, _ runtime.Spec) error {
		entered <- struct{}{}
		select {
		case <-block:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ctx := as(member)
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "booting", WaitForReady: ptr(false)})
	if err != nil || sb.Status != protocol.StatusProvisioning {
		t.Fatalf("create without wait: %v %+v", err, sb)
	}
	<-entered
	// Readers never wait for the boot: it holds the lifecycle lock only.
	if got, err := e.m.GetSandbox(ctx, "booting"); err != nil || got.Status != protocol.StatusProvisioning {
		t.Fatalf("get during boot: %v %+v", err, got)
	}
	// A request waiting on the lifecycle lock gives up with its client.
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := e.m.CaptureSnapshot(wctx, "booting", protocol.CaptureSnapshotRequest{Name: "c"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("capture waiting on a boot: %v, want its deadline", err)
	}
	// A start while provisioning waits for the boot and answers its outcome.
	startErr := make(chan error, 1)
	go func() { _, err := e.m.StartSandbox(ctx, "booting"); startErr <- err }()
	close(block)
	if err := <-startErr; err != nil {
		t.Fatalf("start while provisioning: %v", err)
	}
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatalf("after the boot: %s", got.Status)
	}
	if _, err := e.m.UpdateSandbox(ctx, "booting", protocol.UpdateSandboxRequest{ProxyConfig: []byte(`{"x":1}`)}); fieldOf(err) == "" {
		t.Fatalf("proxy_config without an egress proxy: %v, want a field error", err)
	}
	if _, err := e.m.StopSandbox(ctx, "booting"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "booting", protocol.UpdateSandboxRequest{ProxyConfig: []byte(`{}`)}); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("proxy_config of a stopped sandbox: %v, want invalid request", err)
	}
}

func TestTransitionTable(t *testing.T) {
	e := newEnv(t)
	now := time.Now().UTC()
	half := &store.Sandbox{ID: "00000000-0000-0000-0000-00000000000a", WorkspaceID: workspace, CreatedBy: member.User, Name: "half",
		Status: string(Provisioning), SnapshotID: e.snap.ID, Token: "t", CreatedAt: now, UpdatedAt: now}
	if err := e.st.CreateSandbox(context.Background(), half); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StopSandbox(as(member), "half"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("stop while provisioning: %v, want conflict", err)
	}
	if _, err := e.m.ResetSandbox(as(member), "half", ""); !errors.Is(err, errdefs.ErrNotReady) {
		t.Fatalf("reset while provisioning: %v, want not ready", err)
	}
	sb := e.create(t, member, "t")
	if err := e.m.transition(context.Background(), sb, Provisioning, ""); err == nil {
		t.Fatal("ready → provisioning was allowed")
	}
	if got := e.get(t, sb.ID); got.Status != protocol.StatusReady {
		t.Fatalf("a refused transition changed the record: %s", got.Status)
	}
	for from, tos := range transitions {
		for _, to := range tos {
			if _, ok := transitions[to]; !ok && to != Gone {
				t.Errorf("%s → %s leads to a state with no row", from, to)
			}
		}
	}
	if err := requireStatus(&store.Sandbox{Name: "x", Status: string(Failed)}, opCapture); !errors.Is(err, errdefs.ErrNotReady) {
		t.Fatalf("capture of a failed sandbox: %v", err)
	}
}

func TestFailedBootRetriedByStart(t *testing.T) {
	e := newEnv(t)
	e.net.SetupErr = errors.New("no addresses left")
	sb, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "f"})
	if err == nil || e.get(t, sb.ID).Status != protocol.StatusFailed {
		t.Fatalf("create with a broken network: %v", err)
	}
	if _, err := e.m.Dataplane(as(member), sb.ID, authz.Exec); !errors.Is(err, errdefs.ErrNotReady) {
		t.Fatalf("dataplane on a failed sandbox: %v, want not ready", err)
	}
	e.net.SetupErr = nil
	got, err := e.m.StartSandbox(as(member), "f")
	if err != nil || got.Status != protocol.StatusReady {
		t.Fatalf("start of a failed sandbox: %v %+v", err, got)
	}
	// A failed restart of a stopped sandbox leaves it stopped, saying why.
	if _, err := e.m.StopSandbox(as(member), "f"); err != nil {
		t.Fatal(err)
	}
	e.storage.MountErr = errors.New("disk gone")
	if _, err := e.m.StartSandbox(as(member), "f"); err == nil {
		t.Fatal("start with a broken disk succeeded")
	}
	if rec := e.get(t, sb.ID); rec.Status != protocol.StatusStopped || !strings.HasPrefix(rec.StatusMessage, "start failed: ") {
		t.Fatalf("after a failed restart: %s %q", rec.Status, rec.StatusMessage)
	}
}

func TestDataplaneWakesAndGoneCloses(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, member, "dp")
	if _, err := e.m.StopSandbox(as(member), "dp"); err != nil {
		t.Fatal(err)
	}
	c, err := e.m.Dataplane(as(member), sb.ID, authz.Exec)
	if err != nil {
		t.Fatalf("dataplane on a stopped sandbox: %v", err)
	}
	if c.Agent == nil || e.get(t, sb.ID).Status != protocol.StatusReady {
		t.Fatal("dataplane did not wake the sandbox")
	}
	if err := c.Agent.Health(context.Background()); err != nil {
		t.Fatalf("the woken sandbox's agent: %v", err)
	}
	c.Touch()
	ip, gone, err := e.m.Address(context.Background(), sb.ID)
	if err != nil || !ip.IsLoopback() {
		t.Fatalf("address: %v %v", ip, err)
	}
	done := make(chan error, 1)
	go func() { _, err := e.m.StopSandbox(as(member), "dp"); done <- err }()
	select {
	case <-c.Gone:
	case <-time.After(5 * time.Second):
		t.Fatal("Gone did not close when the sandbox stopped")
	}
	<-gone
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if msg := e.m.StatusMessage(context.Background(), sb.ID); msg != "" {
		t.Fatalf("status message of a stopped-by-request sandbox: %q", msg)
	}
	c.Release()
	c.Release() // idempotent
}

func TestDiedSandboxIsStoppedWithWhy(t *testing.T) {
	e := newEnv(t)
	sb := e.create(t, member, "dies")
	e.driver.Kill(runtimeID(sb.ID))
	eventually(t, "the watcher", func() bool { return e.get(t, sb.ID).Status == protocol.StatusStopped })
	if msg := e.m.StatusMessage(context.Background(), sb.ID); !strings.Contains(msg, "exited unexpectedly (killed by the test)") {
		t.Fatalf("status message: %q", msg)
	}
}

// TestDiedBeforeWatchedIsStopped: the watcher finds the sandbox's process
// after the boot answered; an instance already gone by then has died, and
// is recorded so rather than left ready and unwatched.
func TestDiedBeforeWatchedIsStopped(t *testing.T) {
	e := newEnv(t)
	var once sync.Once
	e.driver.PIDHook = func(id string) { once.Do(func() { e.driver.Kill(id) }) }
	sb := e.create(t, member, "dies-early")
	eventually(t, "the watcher", func() bool { return e.get(t, sb.ID).Status == protocol.StatusStopped })
	if msg := e.m.StatusMessage(context.Background(), sb.ID); !strings.Contains(msg, "exited unexpectedly (killed by the test)") {
		t.Fatalf("status message: %q", msg)
	}
}

func TestUpdateSandbox(t *testing.T) {
	e := newEnv(t)
	e.create(t, member, "u")
	e.create(t, member, "taken")
	ctx := as(member)
	if got, err := e.m.UpdateSandbox(ctx, "u", protocol.UpdateSandboxRequest{}); err != nil || got.Name != "u" {
		t.Fatalf("empty patch: %v", err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "u", protocol.UpdateSandboxRequest{Name: ptr("taken")}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("rename onto a taken name: %v", err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "u", protocol.UpdateSandboxRequest{IdleTTLSeconds: ptr(int64(-1))}); fieldOf(err) == "" {
		t.Fatalf("negative ttl: %v", err)
	}
	got, err := e.m.UpdateSandbox(ctx, "u", protocol.UpdateSandboxRequest{Name: ptr("v"), IdleTTLSeconds: ptr(int64(120)),
		DeleteAfterStopSeconds: ptr(int64(60)), RunConfig: &protocol.RunConfig{WorkDir: "/w"}})
	if err != nil {
		t.Fatal(err)
	}
	rec := e.get(t, got.ID)
	if rec.Name != "v" || rec.IdleTTLSeconds != 120 || rec.DeleteAfterStopSeconds != 60 || rec.RunConfig == nil || rec.RunConfig.WorkDir != "/w" {
		t.Fatalf("patched record: %+v", rec)
	}
}

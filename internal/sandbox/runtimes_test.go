package sandbox

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// uncheckpointed is a fake runtime without Checkpointer, as the microvm
// runtime: it lists, pauses and meters its instances, nothing more.
type uncheckpointed struct {
	runtime.Driver
	runtime.Lister
	runtime.Pauser
	runtime.Meter
}

// withSecond makes e's manager serve a second fake runtime, "second"
// (no memory checkpoints), after the default "fake"; it returns its
// driver.
func withSecond(t *testing.T) (*sandboxtest.Driver, envOption) {
	second, err := sandboxtest.NewDriver()
	if err != nil {
		t.Fatal(err)
	}
	second.RuntimeName = "second"
	return second, func(c *Config) {
		second.AgentPort = c.AgentPort // the manager dials one agent port
		c.Drivers = append(c.Drivers, uncheckpointed{second, second, second, second})
		t.Cleanup(func() {
			ids, _ := second.List(context.Background())
			for _, id := range ids {
				second.Stop(context.Background(), id)
			}
		})
	}
}

func (e *env) createOn(t *testing.T, name, rt string) *store.Sandbox {
	t.Helper()
	sb, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: name, Runtime: rt})
	if err != nil || sb.Status != protocol.StatusReady {
		t.Fatalf("create %s on %q: %+v %v", name, rt, sb, err)
	}
	return sb
}

// TestSandboxOnSecondRuntime: a sandbox created with runtime "second"
// records it and is started, exec'd into, stopped and started again on
// that driver only; one created without runs on the default. What a
// runtime cannot do is refused for its sandboxes only.
func TestSandboxOnSecondRuntime(t *testing.T) {
	second, opt := withSecond(t)
	e := newEnv(t, opt)
	ctx := as(member)
	a := e.createOn(t, "a", "")
	b := e.createOn(t, "b", "second")
	if a.Runtime != "fake" || b.Runtime != "second" || e.get(t, b.ID).Runtime != "second" {
		t.Fatalf("runtimes recorded: a %q b %q", a.Runtime, b.Runtime)
	}
	ra, rb := runtimeID(a.ID), runtimeID(b.ID)
	if _, ok := e.driver.Spec(ra); !ok {
		t.Fatal("a sandbox without a runtime is not on the default")
	}
	if _, ok := e.driver.Spec(rb); ok {
		t.Fatal("a sandbox of the second runtime started on the default")
	}
	if _, ok := second.Spec(rb); !ok || second.Instances() != 1 {
		t.Fatal("a sandbox of the second runtime is not on its driver")
	}

	c, err := e.m.Dataplane(ctx, b.ID, authz.Exec)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Agent.Health(ctx); err != nil || second.Agent(rb).Token() != e.get(t, b.ID).Token {
		t.Fatalf("the exec path does not reach the second runtime's agent: %v", err)
	}
	c.Release()

	if _, err := e.m.StopSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if second.Instances() != 0 || e.driver.Instances() != 1 {
		t.Fatalf("stop: second runs %d, default %d", second.Instances(), e.driver.Instances())
	}
	if _, err := e.m.StartSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, ok := second.Spec(rb); !ok || e.driver.Instances() != 1 {
		t.Fatal("start did not boot the sandbox on its own runtime again")
	}

	var fe *errdefs.FieldError
	_, err = e.m.CaptureSnapshot(ctx, "b", protocol.CaptureSnapshotRequest{Name: "mem-b", IncludeMemory: true})
	if !errors.As(err, &fe) || fe.Field != "include_memory" || !strings.Contains(fe.Msg, "second") {
		t.Fatalf("memory capture on the second runtime: %v", err)
	}
	if _, err := e.m.CaptureSnapshot(ctx, "a", protocol.CaptureSnapshotRequest{Name: "mem-a", IncludeMemory: true}); err != nil {
		t.Fatalf("memory capture on the default runtime: %v", err)
	}
	_, err = e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "p", Runtime: "second", PreserveMemoryOnStop: ptr(true)})
	if !errors.As(err, &fe) || fe.Field != "preserve_memory_on_stop" {
		t.Fatalf("preserve_memory_on_stop on the second runtime: %v", err)
	}
	if sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "p", PreserveMemoryOnStop: ptr(true)}); err != nil || !sb.PreserveMemoryOnStop {
		t.Fatalf("preserve_memory_on_stop on the default runtime: %v", err)
	}
	st, err := e.m.Stats(ctx, "b")
	if err != nil || st.Runtime != "second" || st.CPUSeconds != sandboxtest.FakeCPUSeconds {
		t.Fatalf("stats of the second runtime's sandbox: %+v %v", st, err)
	}

	if err := e.m.DeleteSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := second.List(context.Background()); len(ids) != 0 {
		t.Fatalf("delete left %v on the second runtime", ids)
	}
}

// TestForkStaysOnParentRuntime: branches run on their parent's runtime,
// not the default.
func TestForkStaysOnParentRuntime(t *testing.T) {
	second, opt := withSecond(t)
	e := newEnv(t, opt)
	e.createOn(t, "p", "second")
	res, err := e.m.Fork(as(member), "p", protocol.ForkRequest{Count: 2})
	if err != nil || len(res.Sandboxes) != 2 {
		t.Fatalf("fork: %+v %v", res, err)
	}
	for _, br := range res.Sandboxes {
		if _, ok := second.Spec(runtimeID(br.ID)); !ok || br.Runtime != "second" {
			t.Fatalf("branch %s runs on %q", br.Name, br.Runtime)
		}
	}
	if e.driver.Instances() != 0 || second.Instances() != 3 {
		t.Fatalf("default runs %d, second %d; want 0 and 3", e.driver.Instances(), second.Instances())
	}
}

// TestUnknownRuntimeRefused: a create naming a runtime the daemon does
// not serve is a FieldError on runtime listing those it serves, and
// records nothing.
func TestUnknownRuntimeRefused(t *testing.T) {
	_, opt := withSecond(t)
	e := newEnv(t, opt)
	_, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "x", Runtime: "gvisor"})
	var fe *errdefs.FieldError
	if !errors.As(err, &fe) || fe.Field != "runtime" || !strings.Contains(fe.Msg, "fake, second") {
		t.Fatalf("create on an unknown runtime: %v", err)
	}
	if n := len(e.all(t)); n != 0 {
		t.Fatalf("%d records after a refused create", n)
	}
	got := e.m.Runtimes()
	if len(got) != 2 || got[0].Name != "fake" || got[1].Name != "second" { // the default first
		t.Fatalf("runtimes served: %+v", got)
	}
}

// TestReadoptPerRuntime: a restarted daemon re-adopts each running
// sandbox on its own runtime, cleans up an instance no record has on the
// runtime holding it, and stops (not moves) a sandbox whose runtime it no
// longer serves: starting it is a conflict naming the runtime.
func TestReadoptPerRuntime(t *testing.T) {
	second, opt := withSecond(t)
	e := newEnv(t, opt)
	ctx := context.Background()
	a := e.createOn(t, "a", "")
	b := e.createOn(t, "b", "second")
	lost := e.createOn(t, "lost", "second")
	if err := e.st.DeleteSandbox(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	left, err := e.m.Leftovers(ctx)
	if err != nil || len(left) == 0 || left[0] != (Leftover{Kind: LeftoverRuntime, ID: runtimeID(lost.ID), Runtime: "second"}) {
		t.Fatalf("leftovers: %+v %v", left, err)
	}

	e.reopen(t)
	for _, sb := range []*store.Sandbox{a, b} {
		if c, _ := e.m.instance(sb.ID); c == nil || e.get(t, sb.ID).Status != protocol.StatusReady {
			t.Fatalf("%s (%s) not re-adopted", sb.Name, sb.Runtime)
		}
	}
	if running, _ := second.Running(ctx, runtimeID(lost.ID)); running {
		t.Fatal("the second runtime's leftover still runs")
	}
	if _, ok := second.Spec(runtimeID(b.ID)); !ok {
		t.Fatal("re-adoption stopped the second runtime's sandbox")
	}

	// Restarted serving the default only.
	e.m.Close()
	cfg := e.m.cfg
	cfg.Drivers = cfg.Drivers[:1]
	if e.m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if got := e.get(t, b.ID); got.Status != protocol.StatusStopped || got.Runtime != "second" || !strings.Contains(got.StatusMessage, "does not serve") {
		t.Fatalf("sandbox of an unserved runtime: %s on %q", got.Status, got.Runtime)
	}
	if c, _ := e.m.instance(a.ID); c == nil {
		t.Fatal("the default runtime's sandbox was not re-adopted")
	}
	_, err = e.m.StartSandbox(as(member), "b")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "second") {
		t.Fatalf("start on an unserved runtime: %v", err)
	}
	if e.driver.Instances() != 1 {
		t.Fatalf("the default runs %d instances; the unserved runtime's sandbox moved to it", e.driver.Instances())
	}
}

// TestMemorySnapshotRestoresOnItsRuntime: on a daemon whose default
// runtime cannot checkpoint, a memory snapshot captured on the one that can
// records it, and a create from it that names no runtime runs there and
// is restored; one naming the default boots cold (the image is not its).
func TestMemorySnapshotRestoresOnItsRuntime(t *testing.T) {
	second, err := sandboxtest.NewDriver()
	if err != nil {
		t.Fatal(err)
	}
	second.RuntimeName = "second"
	e := newEnv(t, func(c *Config) {
		second.AgentPort = c.AgentPort
		// The default "second" cannot checkpoint; "fake" (the usual one) can.
		c.Drivers = []runtime.Driver{uncheckpointed{second, second, second, second}, c.Drivers[0]}
		t.Cleanup(func() {
			ids, _ := second.List(context.Background())
			for _, id := range ids {
				second.Stop(context.Background(), id)
			}
		})
	})
	ctx := as(member)
	e.createOn(t, "src", "fake")
	v, err := e.m.CaptureSnapshot(ctx, "src", protocol.CaptureSnapshotRequest{Name: "mem", IncludeMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	if got := imageRuntime(e.m.cfg.Storage.MemoryDir(v.Snapshot.ID)); got != "fake" {
		t.Fatalf("memory image records runtime %q, want fake", got)
	}
	b, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "branch", SnapshotID: v.Snapshot.ID})
	if err != nil || b.Runtime != "fake" {
		t.Fatalf("create from the memory snapshot naming no runtime: %+v, %v; want it on fake", b, err)
	}
	e.requireRestored(t, b.ID, true)
	cold, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "cold", SnapshotID: v.Snapshot.ID, Runtime: "second"})
	if err != nil || cold.Runtime != "second" || second.Restored(runtimeID(cold.ID)) {
		t.Fatalf("create on the default from another runtime's image: %+v, %v; want a cold boot on second", cold, err)
	}
	_, err = e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "must", SnapshotID: v.Snapshot.ID, Runtime: "second", RestoreMemory: ptr(true)})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("restore_memory: true on a runtime the image is not of: %v, want a conflict", err)
	}
}

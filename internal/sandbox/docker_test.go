package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestDockerOptIn: docker: true reaches the runtime and the record; a
// snapshot captured from such a sandbox passes it on to sandboxes
// created from it, unless their create says docker: false.
func TestDockerOptIn(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "d", Docker: ptr(true)})
	if err != nil {
		t.Fatal(err)
	}
	if spec, _ := e.driver.Spec(runtimeID(sb.ID)); !sb.Docker || !spec.Docker {
		t.Fatalf("record docker %v, runtime spec docker %v; want both", sb.Docker, spec.Docker)
	}
	if plain := e.create(t, member, "plain"); plain.Docker {
		t.Fatal("a sandbox created without docker has it")
	}
	if _, err := e.m.CaptureSnapshot(ctx, "d", protocol.CaptureSnapshotRequest{Name: "with-docker"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		docker *bool
		want   bool
	}{{nil, true}, {ptr(false), false}} {
		b, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotName: "with-docker", Docker: c.docker})
		if err != nil {
			t.Fatal(err)
		}
		if spec, _ := e.driver.Spec(runtimeID(b.ID)); b.Docker != c.want || spec.Docker != c.want {
			t.Errorf("from the captured snapshot with docker %v: record %v, spec %v; want %v", c.docker, b.Docker, spec.Docker, c.want)
		}
	}
}

// TestDockerNeedsADockerHost: a runtime that cannot host Docker (the
// namespace one) refuses docker: true, and a snapshot that asks for it
// unless the create turns it off, naming the field.
func TestDockerNeedsADockerHost(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Drivers = []runtime.Driver{plainDriver{c.Drivers[0]}} })
	ctx := as(member)
	var fe *errdefs.FieldError
	for _, req := range []protocol.CreateSandboxRequest{
		{Name: "x", Docker: ptr(true)},
		{Name: "x", Docker: ptr(true), SnapshotName: "no-such"}, // before the snapshot is looked up
	} {
		if _, err := e.m.CreateSandbox(ctx, req); !errors.As(err, &fe) || fe.Field != "docker" {
			t.Fatalf("create with docker from %q: %v; want a field error on docker", req.SnapshotName, err)
		}
	}
	e.snap.ID, e.snap.Name, e.snap.Docker = "snap-docker", "dockerish", true
	if err := e.st.CreateSnapshot(context.Background(), e.snap); err != nil {
		t.Fatal(err)
	}
	req := protocol.CreateSandboxRequest{Name: "y", SnapshotID: "snap-docker"}
	if _, err := e.m.CreateSandbox(as(admin), req); !errors.As(err, &fe) || fe.Field != "docker" {
		t.Fatalf("create from a docker snapshot: %v; want a field error on docker", err)
	}
	req.Docker = ptr(false)
	if sb, err := e.m.CreateSandbox(as(admin), req); err != nil || sb.Docker {
		t.Fatalf("create from a docker snapshot with docker: false: %+v, %v", sb, err)
	}
}

// bootingSource is a fakeSource whose snapshots boot with Docker inside.
type bootingSource struct{ *fakeSource }

func (bootingSource) Boot() BuiltinBoot { return BuiltinBoot{Docker: true} }

// TestOnDemandBuiltin: an on-demand built-in is not made until a create
// names it; then one build starts however many creates wait for it, and
// its sandboxes take its boot settings. A workspace's own snapshot of
// the name is used instead and builds nothing.
func TestOnDemandBuiltin(t *testing.T) {
	src := bootingSource{newFakeSource("d1", nil)}
	e := newEnv(t, func(c *Config) { c.OnDemandBuiltins = map[string]BuiltinSource{"docker": src} })
	src.layers = e.snap.Layers
	if n := len(e.builtins(t)); n != 0 {
		t.Fatalf("%d built-ins before any use", n)
	}
	_, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{SnapshotName: "docker", WaitForReady: ptr(false)})
	if !errors.Is(err, errdefs.ErrNotReady) {
		t.Fatalf("first use: %v; want not ready while it builds", err)
	}
	got := make(chan error, 1)
	go func() {
		sb, err := e.m.CreateSandbox(as(other), protocol.CreateSandboxRequest{SnapshotName: "docker", WaitForReady: ptr(true), Timeout: ptr[int64](10)})
		if err == nil && !sb.Docker {
			err = errors.New("a sandbox of the docker built-in without docker")
		}
		got <- err
	}()
	eventually(t, "the build running", func() bool { return src.calls.Load() == 1 })
	close(src.release)
	if err := <-got; err != nil {
		t.Fatalf("create waiting for the on-demand build: %v", err)
	}
	if n, b := src.calls.Load(), e.builtins(t); n != 1 || len(b) != 1 || !b[0].Docker {
		t.Fatalf("%d builds, built-ins %+v; want one, with docker", n, b)
	}
	src.key = "d2" // a new recipe, which the workspace's own snapshot hides
	own := *e.snap
	own.ID, own.Name = "snap-own-docker", "docker"
	if err := e.st.CreateSnapshot(context.Background(), &own); err != nil {
		t.Fatal(err)
	}
	sb, err := e.m.CreateSandbox(as(admin), protocol.CreateSandboxRequest{SnapshotName: "docker"})
	if err != nil || sb.SnapshotID != own.ID || src.calls.Load() != 1 {
		t.Fatalf("create naming the workspace's own docker: %+v, %v, %d builds; want its own, no build", sb, err, src.calls.Load())
	}
}

// TestClientBuilderBootsBuilder: a create naming no snapshot with the
// official clients' builder name boots the builder built-in (made on
// demand); any other name boots the default.
func TestClientBuilderBootsBuilder(t *testing.T) {
	src := bootingSource{newFakeSource("b1", nil)}
	e := newEnv(t, func(c *Config) { c.OnDemandBuiltins = map[string]BuiltinSource{BuilderSnapshot: src} })
	src.layers = e.snap.Layers
	close(src.release)
	sb, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "snapshot-builder-0123456789ab", WaitForReady: ptr(true), Timeout: ptr[int64](10)})
	if err != nil {
		t.Fatal(err)
	}
	b := e.builtins(t)
	if len(b) != 1 || b[0].Name != BuilderSnapshot || sb.SnapshotID != b[0].ID || !sb.Docker {
		t.Fatalf("builder sandbox from %s (docker %v); built-ins %+v", sb.SnapshotID, sb.Docker, b)
	}
	if other := e.create(t, member, "snapshot-builder-x"); other.SnapshotID != e.snap.ID {
		t.Fatalf("a sandbox merely named like a builder booted %s, not the default", other.SnapshotID)
	}
}

// TestDockerKeepsNoMemory: a sandbox with Docker inside takes no
// memory-preserving stop (on create or PATCH) and no memory snapshot,
// and a memory snapshot of another sandbox boots with Docker only cold.
func TestDockerKeepsNoMemory(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	var fe *errdefs.FieldError
	_, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "p", Docker: ptr(true), PreserveMemoryOnStop: ptr(true)})
	if !errors.As(err, &fe) || fe.Field != "preserve_memory_on_stop" {
		t.Fatalf("create with docker and preserve_memory_on_stop: %v", err)
	}
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "d", Docker: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "d", protocol.UpdateSandboxRequest{PreserveMemoryOnStop: ptr(true)}); !errors.As(err, &fe) || fe.Field != "preserve_memory_on_stop" {
		t.Fatalf("PATCH preserve_memory_on_stop on a docker sandbox: %v", err)
	}
	if _, err := e.m.CaptureSnapshot(ctx, "d", protocol.CaptureSnapshotRequest{Name: "m", IncludeMemory: true}); !errors.As(err, &fe) || fe.Field != "include_memory" {
		t.Fatalf("memory snapshot of a docker sandbox: %v", err)
	}
	e.create(t, member, "plain")
	if _, err := e.m.CaptureSnapshot(ctx, "plain", protocol.CaptureSnapshotRequest{Name: "mem", IncludeMemory: true}); err != nil {
		t.Fatal(err)
	}
	req := protocol.CreateSandboxRequest{SnapshotName: "mem", Docker: ptr(true)}
	if _, err := e.m.CreateSandbox(ctx, req); !errors.As(err, &fe) || fe.Field != "docker" {
		t.Fatalf("docker from a memory snapshot: %v", err)
	}
	req.RestoreMemory = ptr(false)
	if sb, err := e.m.CreateSandbox(ctx, req); err != nil || !sb.Docker {
		t.Fatalf("docker from a memory snapshot, cold: %+v %v", sb, err)
	}
}

package sandbox

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// fakeMounts records what the manager asks of its data mounts.
type fakeMounts struct {
	src    string
	mu     sync.Mutex
	log    []string // "up <id>", "down <id>", "remove <id>"
	bad    error    // Validate's answer
	up     error    // Up's answer
	health string   // Health's answer ("" for ok)
}

func (f *fakeMounts) Validate(_ context.Context, _ auth.Principal, cfg, _ []byte) ([]string, error) {
	return nil, f.bad
}

func (f *fakeMounts) Up(_ context.Context, id, _ string, cfg, _ []byte) ([]runtime.Mount, error) {
	f.record("up " + id)
	if f.up != nil {
		return nil, f.up
	}
	return []runtime.Mount{{Source: f.src, Target: "/data"}}, nil
}

func (f *fakeMounts) Down(_ context.Context, id string) error   { f.record("down " + id); return nil }
func (f *fakeMounts) Remove(_ context.Context, id string) error { f.record("remove " + id); return nil }
func (f *fakeMounts) Health(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.health != "" {
		return f.health
	}
	return "mounts: /data (s3) ok"
}

func (f *fakeMounts) record(s string) {
	f.mu.Lock()
	f.log = append(f.log, s)
	f.mu.Unlock()
}

func (f *fakeMounts) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

const mountCfg = `{"mounts":[{"id":"d","type":"s3","mount_path":"/data","s3":{"bucket":"bkt"}}]}`

func newMountsEnv(t *testing.T) (*env, *fakeMounts) {
	fm := &fakeMounts{src: t.TempDir()}
	return newEnv(t, func(c *Config) { c.Mounts = fm }), fm
}

func (e *env) createMounted(t *testing.T, name string) *store.Sandbox {
	t.Helper()
	sb, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: name, MountConfig: []byte(mountCfg)})
	if err != nil || sb.Status != protocol.StatusReady {
		t.Fatalf("create %s: %v %+v", name, err, sb)
	}
	return sb
}

// TestDataMountsOnEveryBoot: the mounts are up before the sandbox is ready
// and bound into its runtime at create and at every start, their health is
// in its status message, and they go down at stop and away at delete.
func TestDataMountsOnEveryBoot(t *testing.T) {
	e, fm := newMountsEnv(t)
	sb := e.createMounted(t, "m")
	rid := runtimeID(sb.ID)
	spec, _ := e.driver.Spec(rid)
	if len(spec.Mounts) != 1 || spec.Mounts[0] != (runtime.Mount{Source: fm.src, Target: "/data"}) {
		t.Fatalf("runtime spec mounts = %+v", spec.Mounts)
	}
	if sb.StatusMessage != "mounts: /data (s3) ok" {
		t.Fatalf("status message = %q", sb.StatusMessage)
	}
	if string(e.get(t, sb.ID).MountConfig) != mountCfg {
		t.Fatal("mount_config not recorded")
	}
	// The status message follows the mounts' health while it runs.
	fm.mu.Lock()
	fm.health = "mounts: /data (s3) degraded: s3 get x: EOF"
	fm.mu.Unlock()
	if got, err := e.m.GetSandbox(as(member), "m"); err != nil || got.StatusMessage != "mounts: /data (s3) degraded: s3 get x: EOF" {
		t.Fatalf("live status message = %q, %v", got.StatusMessage, err)
	}
	fm.mu.Lock()
	fm.health = ""
	fm.mu.Unlock()
	if _, err := e.m.StopSandbox(as(member), "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(as(member), "m"); err != nil {
		t.Fatal(err)
	}
	if spec, _ := e.driver.Spec(rid); len(spec.Mounts) != 1 {
		t.Fatalf("restart lost the mounts: %+v", spec.Mounts)
	}
	if err := e.m.DeleteSandbox(as(member), "m"); err != nil {
		t.Fatal(err)
	}
	want := []string{"up " + sb.ID, "down " + sb.ID, "up " + sb.ID, "remove " + sb.ID}
	if got := fm.calls(); !slices.Equal(got, want) {
		t.Fatalf("calls = %v, want %v", got, want)
	}
}

// TestDataMountsRefused: a mount_config the mounts refuse, or one on a
// daemon without mounts, leaves no sandbox behind.
func TestDataMountsRefused(t *testing.T) {
	e, fm := newMountsEnv(t)
	fm.bad = errdefs.Field("mount_config.mounts[0].s3.bucket", "bad")
	_, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "x", MountConfig: []byte(mountCfg)})
	var fe *errdefs.FieldError
	if !errors.As(err, &fe) || fe.Field != "mount_config.mounts[0].s3.bucket" {
		t.Fatalf("create: %v", err)
	}
	plain := newEnv(t)
	_, err = plain.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "y", MountConfig: []byte(mountCfg)})
	if !errors.As(err, &fe) || fe.Field != "mount_config" {
		t.Fatalf("create without mounts: %v", err)
	}
	if len(e.all(t)) != 0 || len(plain.all(t)) != 0 || len(fm.calls()) != 0 {
		t.Fatalf("a refused create left %v / %v, calls %v", e.all(t), plain.all(t), fm.calls())
	}
	// A mount that cannot be served fails the boot with its cause, and
	// what the boot built is taken down.
	fm.bad, fm.up = nil, errors.New("s3 list: access denied: InvalidAccessKeyId")
	sb, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "z", MountConfig: []byte(mountCfg)})
	if err == nil || sb.Status != protocol.StatusFailed || !strings.Contains(sb.StatusMessage, "InvalidAccessKeyId") {
		t.Fatalf("create with a failing mount: %v %+v", err, sb)
	}
	if running, _ := e.driver.Running(context.Background(), runtimeID(sb.ID)); running {
		t.Fatal("the runtime of a failed boot is running")
	}
}

// TestDataMountsAfterDaemonRestart: a running sandbox whose mounts the old
// daemon served is restarted by the new one, mounts served again.
func TestDataMountsAfterDaemonRestart(t *testing.T) {
	e, fm := newMountsEnv(t)
	sb := e.createMounted(t, "m")
	plain := e.create(t, member, "plain")
	e.reopen(t)
	eventually(t, "the restart", func() bool {
		got := e.get(t, sb.ID)
		return got.Status == protocol.StatusReady && len(fm.calls()) == 3
	})
	if got := fm.calls(); !slices.Equal(got, []string{"up " + sb.ID, "down " + sb.ID, "up " + sb.ID}) {
		t.Fatalf("calls = %v", got)
	}
	if c, _ := e.m.instance(plain.ID); c == nil {
		t.Fatal("a sandbox without mounts was not re-adopted")
	}
}

// TestDataMountsForkAndCapture: branches get the parent's mounts; a
// capture says it holds none of their data.
func TestDataMountsForkAndCapture(t *testing.T) {
	e, _ := newMountsEnv(t)
	e.createMounted(t, "m")
	res, err := e.m.Fork(as(member), "m", protocol.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range res.Sandboxes {
		got := e.get(t, b.ID)
		if string(got.MountConfig) != mountCfg || got.Status != protocol.StatusReady {
			t.Fatalf("branch %s: %s %q", got.Name, got.Status, got.MountConfig)
		}
		if spec, _ := e.driver.Spec(runtimeID(b.ID)); len(spec.Mounts) != 1 {
			t.Fatalf("branch runtime mounts = %+v", spec.Mounts)
		}
	}
	v, err := e.m.CaptureSnapshot(as(member), "m", protocol.CaptureSnapshotRequest{Name: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(v.StatusMessage, "without the data of its mounts: /data (s3)") {
		t.Fatalf("capture status message = %q", v.StatusMessage)
	}
}

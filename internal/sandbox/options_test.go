package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestCPUMillicores: the runtime gets the exact millicores, the quota
// counts them rounded up to vCPUs, and a resize by vcpus alone goes back
// to whole cores.
func TestCPUMillicores(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	e.setQuota(t, store.Quota{MaxVCPUs: ptr(int64(2))})
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "big", CPUMillicores: ptr(int64(2100))}); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("2100 millicores under a 2-vCPU quota: %v", err)
	}
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "half", CPUMillicores: ptr(int64(500))})
	if err != nil || sb.VCPUs != 1 || sb.MilliCPUs() != 500 {
		t.Fatalf("create with 500 millicores: %+v %v", sb, err)
	}
	if spec, _ := e.driver.Spec(runtimeID(sb.ID)); spec.Limits.MilliCPUs != 500 {
		t.Fatalf("runtime limit %d millicores, want 500", spec.Limits.MilliCPUs)
	}
	if _, err := e.m.UpdateSandbox(ctx, "half", protocol.UpdateSandboxRequest{CPUMillicores: ptr(int64(2500))}); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("resize to 2500 millicores (3 vCPUs) under a 2-vCPU quota: %v", err)
	}
	got, err := e.m.UpdateSandbox(ctx, "half", protocol.UpdateSandboxRequest{VCPUs: ptr(int64(2))})
	if err != nil || got.MilliCPUs() != 2000 || e.get(t, sb.ID).CPUMillicores != 0 {
		t.Fatalf("resize by vcpus: %+v %v", got, err)
	}
}

// TestNonPersistentSandbox: persistent: false discards the filesystem at
// a stop (the next start boots afresh from the snapshot, labels and all),
// and cannot be combined with a memory-preserving stop.
func TestNonPersistentSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "x", Persistent: ptr(false), PreserveMemoryOnStop: ptr(true)}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("persistent: false with preserve_memory_on_stop: %v", err)
	}
	for _, c := range []struct {
		name       string
		persistent bool
	}{{"keeps", true}, {"forgets", false}} {
		sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: c.name, Persistent: ptr(c.persistent)})
		if err != nil || sb.Persistent != c.persistent {
			t.Fatalf("create %s: %+v %v", c.name, sb, err)
		}
		written := filepath.Join(e.storage.UpperDir(runtimeID(sb.ID)), "written")
		if err := os.WriteFile(written, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := e.m.StopSandbox(ctx, c.name); err != nil {
			t.Fatal(err)
		}
		if got, err := e.m.StartSandbox(ctx, c.name); err != nil || got.Status != protocol.StatusReady {
			t.Fatalf("start %s: %+v %v", c.name, got, err)
		}
		if _, err := os.Stat(written); (err == nil) != c.persistent {
			t.Errorf("%s (persistent %v): a write before the stop exists after the start: %v", c.name, c.persistent, err == nil)
		}
	}
	if _, err := e.m.UpdateSandbox(ctx, "forgets", protocol.UpdateSandboxRequest{PreserveMemoryOnStop: ptr(true)}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("preserve_memory_on_stop on a non-persistent sandbox: %v", err)
	}
}

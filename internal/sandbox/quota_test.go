package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// clientQuotaType is how the official clients (JS extractQuotaType,
// Python extract_quota_type; spec §7.1) classify a 429 by its message.
func clientQuotaType(msg string) string {
	m := strings.ToLower(msg)
	switch {
	case strings.Contains(m, "sandbox") && (strings.Contains(m, "count") || strings.Contains(m, "limit")):
		return "sandbox_count"
	case strings.Contains(m, "cpu"):
		return "cpu"
	case strings.Contains(m, "memory"):
		return "memory"
	case strings.Contains(m, "storage"):
		return "storage"
	}
	return ""
}

func limitKind(err error) string {
	var le *errdefs.LimitError
	if errors.As(err, &le) {
		return le.Kind
	}
	return ""
}

func TestQuotaExceeds(t *testing.T) {
	four := ptr(int64(4))
	used := store.Usage{Sandboxes: 3, VCPUs: 3, MemBytes: 3, StorageBytes: 3, Snapshots: 3}
	for _, tc := range []struct {
		name      string
		q         store.Quota
		claim     store.Usage
		kind, typ string
	}{
		{"unlimited", store.Quota{}, store.Usage{Sandboxes: 100, VCPUs: 100}, "", ""},
		{"sandboxes at the limit", store.Quota{MaxSandboxes: four}, store.Usage{Sandboxes: 1}, "", ""},
		{"sandboxes over", store.Quota{MaxSandboxes: four}, store.Usage{Sandboxes: 2}, errdefs.QuotaSandboxes, "sandbox_count"},
		{"cpu at the limit", store.Quota{MaxVCPUs: four}, store.Usage{VCPUs: 1}, "", ""},
		{"cpu over", store.Quota{MaxVCPUs: four}, store.Usage{VCPUs: 2}, errdefs.QuotaCPU, "cpu"},
		{"memory over", store.Quota{MaxMemBytes: four}, store.Usage{MemBytes: 2}, errdefs.QuotaMemory, "memory"},
		{"storage over", store.Quota{MaxStorageBytes: four}, store.Usage{StorageBytes: 2}, errdefs.QuotaStorage, "storage"},
		{"snapshots over", store.Quota{MaxSnapshots: four}, store.Usage{Snapshots: 2}, errdefs.QuotaSnapshots, ""},
		// A claim that adds nothing of a kind is not refused by it, even
		// when the workspace is already over (a lowered quota).
		{"over but not growing", store.Quota{MaxVCPUs: ptr(int64(1))}, store.Usage{Sandboxes: 1}, "", ""},
		{"zero allows nothing", store.Quota{MaxSandboxes: ptr(int64(0))}, store.Usage{Sandboxes: 1}, errdefs.QuotaSandboxes, "sandbox_count"},
		{"first exceeded kind wins", store.Quota{MaxVCPUs: four, MaxMemBytes: four}, store.Usage{VCPUs: 9, MemBytes: 9}, errdefs.QuotaCPU, "cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := exceeds(tc.q, used, tc.claim)
			if got := limitKind(err); got != tc.kind || (tc.kind == "" && err != nil) {
				t.Fatalf("exceeds = %v; want kind %q", err, tc.kind)
			}
			if err != nil {
				if got := clientQuotaType(err.Error()); got != tc.typ {
					t.Fatalf("the clients would read %q as quotaType %q, want %q", err, got, tc.typ)
				}
			}
		})
	}
}

func (e *env) setQuota(t *testing.T, q store.Quota) {
	t.Helper()
	if err := e.m.SetWorkspaceQuota(context.Background(), workspace, q); err != nil {
		t.Fatal(err)
	}
}

// TestQuotaConcurrentCreates: 20 creates racing for 5 slots leave exactly
// 5 sandboxes; the rest are refused with the sandbox count kind.
func TestQuotaConcurrentCreates(t *testing.T) {
	e := newEnv(t)
	e.setQuota(t, store.Quota{MaxSandboxes: ptr(int64(5))})
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: fmt.Sprintf("c%d", i)})
		}()
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case limitKind(err) == errdefs.QuotaSandboxes:
			refused++
		default:
			t.Fatalf("create: %v", err)
		}
	}
	if ok != 5 || refused != 15 || len(e.all(t)) != 5 {
		t.Fatalf("%d created, %d refused, %d recorded; want 5, 15, 5", ok, refused, len(e.all(t)))
	}
}

// TestQuotaWake: starting a stopped sandbox, explicitly or by a dataplane
// request, is refused over the running-CPU quota and leaves it stopped;
// once room is made it starts.
func TestQuotaWake(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	a := e.create(t, member, "a")
	if _, err := e.m.StopSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.create(t, member, "b")
	e.setQuota(t, store.Quota{MaxVCPUs: ptr(DefaultLimits.DefaultVCPUs)})
	if _, err := e.m.Dataplane(ctx, a.ID); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("dataplane wake over quota: %v", err)
	}
	if _, err := e.m.StartSandbox(ctx, "a"); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("start over quota: %v", err)
	}
	if _, _, err := e.m.Address(ctx, a.ID); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("gateway wake over quota: %v", err)
	}
	if got := e.get(t, a.ID); got.Status != protocol.StatusStopped || e.driver.Instances() != 1 {
		t.Fatalf("a refused wake changed the sandbox: %s, %d instances", got.Status, e.driver.Instances())
	}
	if _, err := e.m.StopSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	c, err := e.m.Dataplane(ctx, a.ID)
	if err != nil {
		t.Fatalf("wake within quota: %v", err)
	}
	c.Release()
	if got := e.get(t, a.ID); got.Status != protocol.StatusReady {
		t.Fatalf("woken sandbox is %s", got.Status)
	}
	// Reset restarts a stopped sandbox: the same check applies.
	if _, err := e.m.ResetSandbox(ctx, "b", ""); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("reset over quota: %v", err)
	}
}

// TestQuotaKinds checks memory, storage (declared fs_capacity_bytes) and
// snapshot quotas on create, snapshot build and capture.
func TestQuotaKinds(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	e.create(t, member, "first")
	e.setQuota(t, store.Quota{MaxMemBytes: ptr(DefaultLimits.DefaultMemBytes)})
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "m"}); limitKind(err) != errdefs.QuotaMemory {
		t.Fatalf("create over memory quota: %v", err)
	}
	e.setQuota(t, store.Quota{MaxStorageBytes: ptr(int64(e.snap.FSCapacityBytes + 1<<20))})
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "s"}); limitKind(err) != errdefs.QuotaStorage {
		t.Fatalf("create over storage quota: %v", err)
	}
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "s", FSCapacityBytes: ptr(int64(1 << 20))}); err != nil {
		t.Fatalf("create within storage quota: %v", err)
	}
	e.setQuota(t, store.Quota{MaxSnapshots: ptr(int64(1))}) // the default snapshot
	if _, err := e.m.CaptureSnapshot(ctx, "first", protocol.CaptureSnapshotRequest{Name: "cap"}); limitKind(err) != errdefs.QuotaSnapshots {
		t.Fatalf("capture over snapshot quota: %v", err)
	}
	if _, err := e.m.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "img", DockerImage: "alpine:3", FSCapacityBytes: 1 << 30}); limitKind(err) != errdefs.QuotaSnapshots {
		t.Fatalf("snapshot build over snapshot quota: %v", err)
	}
	if sns, _ := e.st.ListSnapshots(context.Background(), workspace, store.ListOptions{}); len(sns) != 1 {
		t.Fatalf("%d snapshots after refusals, want 1", len(sns))
	}
	u, _, err := e.m.WorkspaceUsage(context.Background(), workspace)
	if err != nil || u.Sandboxes != 2 || u.VCPUs != 2*DefaultLimits.DefaultVCPUs || u.StorageBytes != e.snap.FSCapacityBytes+1<<20 || u.Snapshots != 1 {
		t.Fatalf("usage: %+v %v", u, err)
	}
}

// TestQuotaFork: a fork whose count would exceed the sandbox quota
// creates no branch and keeps no capture; one that fits creates all.
func TestQuotaFork(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	e.create(t, member, "p")
	e.setQuota(t, store.Quota{MaxSandboxes: ptr(int64(3))})
	if _, err := e.m.Fork(ctx, "p", protocol.ForkRequest{Count: 3}); limitKind(err) != errdefs.QuotaSandboxes {
		t.Fatalf("fork over quota: %v", err)
	}
	sns, _ := e.st.ListSnapshots(context.Background(), workspace, store.ListOptions{})
	if n := len(e.all(t)); n != 1 || len(sns) != 1 {
		t.Fatalf("after a refused fork: %d sandboxes, %d snapshots; want 1, 1", n, len(sns))
	}
	// The branches are one claim: recorded all together or not at all.
	req := protocol.CreateSandboxRequest{Name: "x", SnapshotID: e.snap.ID}
	reqs := []protocol.CreateSandboxRequest{req, req, req}
	reqs[1].Name, reqs[2].Name = "y", "z"
	if _, _, err := e.m.recordBranches(ctx, reqs); limitKind(err) != errdefs.QuotaSandboxes || len(e.all(t)) != 1 {
		t.Fatalf("recording 3 branches over quota: %v, %d sandboxes", err, len(e.all(t)))
	}
	reqs[2].Name = "x" // a clash undoes the ones recorded before it
	e.setQuota(t, store.Quota{})
	if _, _, err := e.m.recordBranches(ctx, reqs); !errors.Is(err, errdefs.ErrConflict) || len(e.all(t)) != 1 {
		t.Fatalf("recording clashing branches: %v, %d sandboxes", err, len(e.all(t)))
	}
	e.setQuota(t, store.Quota{MaxSandboxes: ptr(int64(3))})
	res, err := e.m.Fork(ctx, "p", protocol.ForkRequest{Count: 2})
	if err != nil || len(res.Sandboxes) != 2 {
		t.Fatalf("fork within quota: %v", err)
	}
}

// TestQuotaResize: a PATCH growing a running sandbox's vCPUs or anyone's
// declared storage past a quota is refused and changes nothing;
// shrinking always works; a stopped sandbox may grow and then claims its
// size when it starts. A new fs_capacity_bytes applies at once.
func TestQuotaResize(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb := e.create(t, member, "r")
	e.setQuota(t, store.Quota{MaxVCPUs: ptr(int64(3)), MaxStorageBytes: ptr(e.snap.FSCapacityBytes)})
	if _, err := e.m.UpdateSandbox(ctx, "r", protocol.UpdateSandboxRequest{VCPUs: ptr(int64(4))}); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("grow a running sandbox past the vCPU quota: %v", err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "r", protocol.UpdateSandboxRequest{FSCapacityBytes: ptr(e.snap.FSCapacityBytes + 1)}); limitKind(err) != errdefs.QuotaStorage {
		t.Fatalf("grow past the storage quota: %v", err)
	}
	if got := e.get(t, sb.ID); got.VCPUs != sb.VCPUs || got.FSCapacityBytes != sb.FSCapacityBytes {
		t.Fatalf("a refused resize changed the record: %+v", got)
	}
	got, err := e.m.UpdateSandbox(ctx, "r", protocol.UpdateSandboxRequest{VCPUs: ptr(int64(1)), FSCapacityBytes: ptr(int64(512 << 20))})
	if err != nil || got.VCPUs != 1 || e.get(t, sb.ID).FSCapacityBytes != 512<<20 || e.storage.LimitOf(runtimeID(sb.ID)) != 512<<20 {
		t.Fatalf("shrink: %+v %v (fs limit %d)", got, err, e.storage.LimitOf(runtimeID(sb.ID)))
	}
	if _, err := e.m.StopSandbox(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "r", protocol.UpdateSandboxRequest{VCPUs: ptr(int64(8))}); err != nil {
		t.Fatalf("grow a stopped sandbox: %v", err)
	}
	if _, err := e.m.StartSandbox(ctx, "r"); limitKind(err) != errdefs.QuotaCPU {
		t.Fatalf("start after growing past the quota: %v", err)
	}
	e.setQuota(t, store.Quota{})
	if _, err := e.m.StartSandbox(ctx, "r"); err != nil {
		t.Fatal(err)
	}
	if spec, _ := e.driver.Spec(runtimeID(sb.ID)); spec.Limits.MilliCPUs != 8000 {
		t.Fatalf("restarted with %d milli-CPUs, want the resized 8000", spec.Limits.MilliCPUs)
	}
}

// TestQuotaConcurrentWakes: two stopped sandboxes woken at once with room
// for one: the first wake's reservation holds its vCPUs while it boots
// (its record still says stopped), so exactly one starts.
func TestQuotaConcurrentWakes(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	var ids []string
	for _, n := range []string{"w1", "w2"} {
		ids = append(ids, e.create(t, member, n).ID)
		if _, err := e.m.StopSandbox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	e.setQuota(t, store.Quota{MaxVCPUs: ptr(DefaultLimits.DefaultVCPUs)})
	entered, block := make(chan struct{}, 2), make(chan struct{})
	e.driver.StartHook = func(ctx context.Context, _ runtime.Spec) error {
		entered <- struct{}{}
		<-block
		return nil
	}
	errs := make(chan error, 2)
	for _, id := range ids {
		go func() {
			c, err := e.m.Dataplane(ctx, id)
			if err == nil {
				c.Release()
			}
			errs <- err
		}()
	}
	unblock := sync.OnceFunc(func() { close(block) })
	defer unblock()
	<-entered // one boot is under way; the other wake must be refused
	select {
	case err := <-errs:
		if limitKind(err) != errdefs.QuotaCPU {
			t.Fatalf("second wake while the first boots: %v", err)
		}
	case <-entered:
		t.Fatal("both wakes are booting: the first one's claim was not held")
	}
	unblock()
	if err := <-errs; err != nil {
		t.Fatalf("first wake: %v", err)
	}
	ready := 0
	for _, id := range ids {
		if e.get(t, id).Status == protocol.StatusReady {
			ready++
		}
	}
	if ready != 1 {
		t.Fatalf("%d sandboxes ready, want 1", ready)
	}
}

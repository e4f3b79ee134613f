package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// poolEnv is an env whose default snapshot keeps a warm pool of size
// (refilling), waited until full.
func poolEnv(t *testing.T, size, maxAge int64) *env {
	t.Helper()
	e := newEnv(t)
	if _, err := e.m.SetPool(as(admin), e.snap.ID, size, maxAge); err != nil {
		t.Fatal(err)
	}
	if err := e.m.StartPools(context.Background()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool full", func() bool { return len(e.readyPool()) == int(size) })
	return e
}

// readyPool is the ids of the default snapshot's ready pool instances.
func (e *env) readyPool() map[string]bool {
	e.m.pool.mu.Lock()
	defer e.m.pool.mu.Unlock()
	ids := map[string]bool{}
	for _, pi := range e.m.pool.ready[e.snap.ID] {
		ids[pi.id] = true
	}
	return ids
}

// checkClaimed asserts sb runs on an instance that took its identity: its
// hostname, a machine-id of its own, and only its record's token — the
// agent refuses the token the instance booted with.
func (e *env) checkClaimed(t *testing.T, sb *store.Sandbox, machineIDs map[string]string) {
	t.Helper()
	rid := runtimeID(sb.ID)
	spec, _ := e.driver.Spec(rid)
	ep, err := e.net.Lookup(context.Background(), rid)
	if err != nil {
		t.Fatal(err)
	}
	old := e.m.agentClient(e.driver, rid, ep.SandboxIP, spec.Token)
	defer old.Close()
	var he *agent.HTTPError
	if err := old.Health(context.Background()); !errors.As(err, &he) || he.Status != http.StatusUnauthorized {
		t.Errorf("%s: the pool token still answers: %v", sb.Name, err)
	}
	host, mid := e.driver.Identity(rid)
	if host != sb.Name || len(mid) != 32 {
		t.Errorf("%s: hostname %q machine-id %q", sb.Name, host, mid)
	}
	if other, ok := machineIDs[mid]; ok {
		t.Errorf("%s has the machine-id of %s", sb.Name, other)
	}
	machineIDs[mid] = sb.Name
	if e.driver.Background(rid) {
		t.Errorf("%s: claimed, but still at the pool's background CPU share", sb.Name)
	}
	if got := e.driver.Agent(rid).Token(); got != sb.Token {
		t.Errorf("%s: agent accepts %q, record holds %q", sb.Name, got, sb.Token)
	}
}

// 50 parallel creates against a pool of 10 (refills held back by a create
// in flight): exactly 10 take a pool instance, each a different one, 40
// boot cold, and every sandbox is ready as its record says.
func TestPoolClaimsUnderConcurrency(t *testing.T) {
	e := poolEnv(t, 10, 0)
	pooled := e.readyPool()
	for id := range pooled {
		if !e.driver.Background(runtimeID(id)) {
			t.Errorf("pool instance %s booted at the normal CPU share, not the background one", id)
		}
	}
	hold := e.m.pool.busy()
	var wg sync.WaitGroup
	sbs := make([]*store.Sandbox, 50)
	errs := make([]error, 50)
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sbs[i], errs[i] = e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: fmt.Sprintf("c%02d", i),
				EnvVars: map[string]string{"N": fmt.Sprint(i)}})
		}()
	}
	wg.Wait()
	hold()
	claimed, seen, mids := 0, map[string]bool{}, map[string]string{}
	for i, sb := range sbs {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if sb.Status != protocol.StatusReady || sb.Name != fmt.Sprintf("c%02d", i) || sb.RunConfig.EnvVars["N"] != fmt.Sprint(i) {
			t.Fatalf("create %d: %+v", i, sb)
		}
		if seen[sb.ID] {
			t.Fatalf("id %s handed out twice", sb.ID)
		}
		seen[sb.ID] = true
		if pooled[sb.ID] {
			claimed++
			e.checkClaimed(t, sb, mids)
		} else if host, _ := e.driver.Identity(runtimeID(sb.ID)); host != sb.Name {
			t.Errorf("cold %s: hostname %q", sb.Name, host)
		}
	}
	if claimed != 10 {
		t.Fatalf("%d creates claimed a pool instance, want 10", claimed)
	}
	if n := e.driver.Instances(); n < 50 {
		t.Fatalf("%d instances running, want at least the 50 sandboxes'", n)
	}
	eventually(t, "pool refilled", func() bool { return len(e.readyPool()) == 10 })
}

// What a pool instance cannot become boots cold, leaving the pool as it
// was; an instance that cannot take its identity is torn down and the
// create boots cold under the same id.
func TestPoolFallsBackToColdBoot(t *testing.T) {
	e := poolEnv(t, 1, 0)
	hold := e.m.pool.busy()
	defer hold()
	pooled := e.readyPool()
	for name, req := range map[string]protocol.CreateSandboxRequest{
		"mem":  {MemBytes: ptr(int64(512 << 20))},
		"cpus": {VCPUs: ptr(int64(1))},
	} {
		req.Name = name
		sb, err := e.m.CreateSandbox(as(member), req)
		if err != nil || sb.Status != protocol.StatusReady {
			t.Fatalf("create %s: %v %+v", name, err, sb)
		}
		if pooled[sb.ID] {
			t.Fatalf("create %s claimed a pool instance that cannot serve it", name)
		}
		if spec, _ := e.driver.Spec(runtimeID(sb.ID)); spec.Limits.MemBytes != sb.MemBytes || spec.Limits.MilliCPUs != sb.MilliCPUs() {
			t.Fatalf("create %s: limits %+v", name, spec.Limits)
		}
	}
	if len(e.readyPool()) != 1 {
		t.Fatal("the pool lost its instance to creates it cannot serve")
	}
	e.driver.IdentityErr = errors.New("no identity for you")
	sb := e.create(t, member, "broken-claim")
	if !pooled[sb.ID] {
		t.Fatal("the create did not claim the pool instance")
	}
	if _, mid := e.driver.Identity(runtimeID(sb.ID)); mid != "" {
		t.Fatalf("the cold boot after a failed claim kept the pool instance (machine-id %q)", mid)
	}
	if got := e.driver.Agent(runtimeID(sb.ID)).Token(); got != sb.Token {
		t.Fatalf("agent token %q, record %q", got, sb.Token)
	}
}

// The refiller keeps the pool at its size, recycles instances past
// max_age_seconds (tearing them down), and size 0 drains the pool.
func TestPoolRefillsAndRecyclesByAge(t *testing.T) {
	e := poolEnv(t, 2, 1)
	first := e.readyPool()
	eventually(t, "old instances recycled", func() bool {
		now := e.readyPool()
		for id := range first {
			if now[id] {
				return false
			}
		}
		return len(now) == 2
	})
	for id := range first {
		if ok, _ := e.driver.Running(context.Background(), runtimeID(id)); ok || e.storage.Exists(runtimeID(id)) {
			t.Fatalf("recycled instance %s left running or its storage", id)
		}
	}
	st, err := e.m.Pool(as(member), e.snap.ID)
	if err != nil || st.Size != 2 || st.MaxAgeSeconds != 1 {
		t.Fatalf("pool %+v %v", st, err)
	}
	if _, err := e.m.SetPool(as(admin), e.snap.ID, 0, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool drained", func() bool { return e.driver.Instances() == 0 && e.net.Endpoints() == 0 })
}

// Only a workspace admin sets a pool, within bounds.
func TestSetPoolChecks(t *testing.T) {
	e := newEnv(t)
	if _, err := e.m.SetPool(as(member), e.snap.ID, 1, 0); err == nil {
		t.Fatal("a member set a pool")
	}
	if _, err := e.m.SetPool(as(admin), e.snap.ID, maxPoolSize+1, 0); err == nil {
		t.Fatal("an oversized pool was accepted")
	}
}

// Pool instances a daemon leaves behind (a kill -9: its manager never
// drained them) are torn down by the next daemon's Recover: no instance,
// endpoint, storage or leftover remains.
func TestPoolInstancesTornDownAfterRestart(t *testing.T) {
	e := poolEnv(t, 3, 0)
	ctx := context.Background()
	left := e.readyPool()
	e.m.pool.mu.Lock()
	e.m.pool.ready = map[string][]*pooled{} // what a killed daemon forgets
	e.m.pool.mu.Unlock()
	e.reopen(t)
	if n, eps := e.driver.Instances(), e.net.Endpoints(); n != 0 || eps != 0 {
		t.Fatalf("%d instances, %d endpoints left", n, eps)
	}
	for id := range left {
		if e.storage.Exists(runtimeID(id)) {
			t.Fatalf("storage of pool instance %s left", id)
		}
	}
	if l, err := e.m.Leftovers(ctx); err != nil || len(l) != 0 {
		t.Fatalf("leftovers %+v %v", l, err)
	}
	if rows, err := e.st.ListPoolInstances(ctx); err != nil || len(rows) != 0 {
		t.Fatalf("pool rows %+v %v", rows, err)
	}
}

// Pool instances count against no workspace's quota: a workspace allowed
// one sandbox still creates it with a pool of three up.
func TestPoolInstancesCountAgainstNoQuota(t *testing.T) {
	e := poolEnv(t, 3, 0)
	one := int64(1)
	if err := e.st.PutQuota(context.Background(), workspace, store.Quota{MaxSandboxes: &one}); err != nil {
		t.Fatal(err)
	}
	e.create(t, member, "only")
	if _, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{Name: "second"}); err == nil {
		t.Fatal("quota not enforced")
	}
	eventually(t, "pool intact", func() bool { return len(e.readyPool()) == 3 })
}

var _ = time.Second

// Deleting a snapshot tears its pool down first: no instance stays on
// layers about to go.
func TestDeletingSnapshotDrainsItsPool(t *testing.T) {
	e := poolEnv(t, 2, 0)
	if err := e.m.DeleteSnapshot(as(admin), e.snap.ID); err != nil {
		t.Fatal(err)
	}
	if n, eps := e.driver.Instances(), e.net.Endpoints(); n != 0 || eps != 0 {
		t.Fatalf("%d instances, %d endpoints after the delete", n, eps)
	}
	if pools, err := e.st.ListPools(context.Background()); err != nil || len(pools) != 0 {
		t.Fatalf("pools %+v %v", pools, err)
	}
}

// Refills wait while a create is in flight, then refill.
func TestPoolRefillWaitsForCreates(t *testing.T) {
	e := poolEnv(t, 1, 0)
	hold := e.m.pool.busy()
	e.create(t, member, "claimer")
	time.Sleep(300 * time.Millisecond) // the claim poked the refiller
	if n := len(e.readyPool()); n != 0 {
		t.Fatalf("refilled %d while a create was in flight", n)
	}
	hold()
	eventually(t, "refill after the creates", func() bool { return len(e.readyPool()) == 1 })
}

// A create with volumes or Docker inside never takes a pool instance:
// binds and runsc flags are fixed when the instance starts. Nor does one
// on a runtime other than the default, which pools boot on.
func TestPoolServesNoBindsOrDocker(t *testing.T) {
	m := &Manager{rt: runtimes{&sandboxtest.Driver{}}}
	for name, sb := range map[string]*store.Sandbox{
		"volumes":       {Runtime: "fake", Volumes: []store.VolumeAttachment{{VolumeID: "v", MountPath: "/data"}}},
		"docker":        {Runtime: "fake", Docker: true},
		"other runtime": {Runtime: "second"},
	} {
		if m.poolServes(sb, &store.Snapshot{}, protocol.CreateSandboxRequest{}, runtime.Limits{}) {
			t.Errorf("%s: a pool instance would serve it", name)
		}
	}
	if !m.poolServes(&store.Sandbox{Runtime: "fake"}, &store.Snapshot{}, protocol.CreateSandboxRequest{}, runtime.Limits{}) {
		t.Error("a pool instance would not serve a plain create")
	}
}

package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Warm pools. A snapshot's pool keeps instances prepared ahead (prepare
// of boot.go: rootfs, netns, egress, runtime, agent answering) under ids
// of their own, so a create takes a running instance instead of booting
// one. The claiming record adopts the instance's id — a fresh uuid no
// record ever had, from which runtime, storage and network state are
// keyed (runtimeID) — so nothing downstream needs a mapping. From the
// take on (takePooled, alongside the record's writes) the instance gets
// the record's hostname and a fresh /etc/machine-id (from its agent,
// runtime.AgentIdentifier, or the driver, runtime.Identifier);
// at the claim (claimPooled, inside boot) it takes the rest: a fresh
// agent token (POST /v1/token, authenticated by the pool token, which
// stops working), the record's egress policy and fs_capacity_bytes; env
// and run_config apply per command as always, and the snapshot's start
// command runs then, under the record. No command of any tenant runs in
// a pool instance before its claim. What the instance cannot take — other
// vcpus or memory than it booted with (the pool boots with the daemon's
// defaults), a memory restore, mounts — boots cold instead.
//
// Pool instances belong to no workspace and count against no quota. They
// are recorded (store.PoolInstance) before they exist; a daemon that
// restarts tears down whatever its predecessor left (recoverPools), and
// one that closes tears its pool down. Refills run one at a time, in the
// background, at the lowest CPU share until claimed, and wait while
// creates are in flight.

// poolRefillTick is how often the refiller re-checks sizes and ages when
// nothing wakes it.
const poolRefillTick = time.Second

// maxPoolSize bounds one snapshot's pool.
const maxPoolSize = 64

// PoolObserver is implemented by Observers that also count warm-pool
// claims (internal/telemetry does).
type PoolObserver interface {
	// PoolClaim counts a create from snapshot: a hit took a pool instance.
	PoolClaim(snapshot string, hit bool)
	// PoolClaimed records how long binding a claimed instance took.
	PoolClaimed(took time.Duration)
	// PoolSize reports the instances ready in snapshot's pool.
	PoolSize(snapshot string, ready int)
}

// pooled is one prepared pool instance.
type pooled struct {
	id      string // the sandbox id its claimer adopts
	born    time.Time
	inst    *instance
	undo    cleanup.Stack // tears the instance down
	release func()        // its transient hold (Leftovers)
	// Once taken: when, and the result of giving the instance its
	// claimer's hostname and machine-id, which runs from the take on,
	// alongside the record's writes.
	takenAt    time.Time
	identified chan error
}

// pools is the manager's warm-pool state; its own mutex guards it (taken
// under no other lock).
type pools struct {
	mu       sync.Mutex
	cfg      map[string]store.Pool // per snapshot id
	ready    map[string][]*pooled  // per snapshot id, oldest first
	claimed  map[string]*pooled    // per adopting sandbox id, until boot binds it
	creating int                   // creates in flight: refills wait
	wake     chan struct{}
}

func newPools() *pools {
	return &pools{cfg: map[string]store.Pool{}, ready: map[string][]*pooled{}, claimed: map[string]*pooled{},
		wake: make(chan struct{}, 1)}
}

func (p *pools) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// busy counts a create in flight until the returned func is called.
func (p *pools) busy() (done func()) {
	p.mu.Lock()
	p.creating++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.creating--
		p.mu.Unlock()
		p.poke()
	}
}

// PoolStatus is a snapshot's pool as configured, with its ready instances.
type PoolStatus struct {
	store.Pool
	Ready int
}

// SetPool sets snapshot ref's warm pool (size 0 removes it), as an admin
// of the snapshot's workspace. The built-in snapshot's pool is the
// daemon's (SetDefaultPool).
func (m *Manager) SetPool(ctx context.Context, ref string, size, maxAgeSeconds int64) (PoolStatus, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return PoolStatus{}, err
	}
	sn, err := m.snapshotByRef(ctx, p.WorkspaceID, ref)
	if err != nil {
		return PoolStatus{}, err
	}
	if sn.WorkspaceID != p.WorkspaceID {
		return PoolStatus{}, fmt.Errorf("snapshot %s: the pool of a built-in snapshot is set by the daemon (--pool-default): %w", ref, errdefs.ErrForbidden)
	}
	if p.Role != store.RoleAdmin {
		return PoolStatus{}, fmt.Errorf("setting a warm pool takes a workspace admin: %w", errdefs.ErrForbidden)
	}
	return m.setPool(ctx, sn, size, maxAgeSeconds)
}

// SetDefaultPool sets the pool of the built-in snapshot "default" (the
// daemon's --pool-default).
func (m *Manager) SetDefaultPool(ctx context.Context, size int64) error {
	sn, err := m.cfg.Store.SnapshotByName(ctx, store.BuiltinWorkspace, "default", "")
	if err != nil {
		return fmt.Errorf("pool of the default snapshot: %w", err)
	}
	_, err = m.setPool(ctx, sn, size, 0)
	return err
}

func (m *Manager) setPool(ctx context.Context, sn *store.Snapshot, size, maxAgeSeconds int64) (PoolStatus, error) {
	if size < 0 || size > maxPoolSize {
		return PoolStatus{}, errdefs.Field("size", "must be 0 to %d", maxPoolSize)
	}
	if maxAgeSeconds < 0 {
		return PoolStatus{}, errdefs.Field("max_age_seconds", "must not be negative")
	}
	if !canIdentify(m.rt.def()) && size > 0 {
		return PoolStatus{}, fmt.Errorf("the %s runtime cannot give a running sandbox another identity, which a warm pool needs: %w", m.rt.def().Name(), errdefs.ErrUnavailable)
	}
	cfg := store.Pool{SnapshotID: sn.ID, WorkspaceID: sn.WorkspaceID, Size: size, MaxAgeSeconds: maxAgeSeconds}
	if err := m.cfg.Store.PutPool(ctx, cfg); err != nil {
		return PoolStatus{}, err
	}
	m.pool.mu.Lock()
	if size == 0 {
		delete(m.pool.cfg, sn.ID)
	} else {
		m.pool.cfg[sn.ID] = cfg
	}
	ready := len(m.pool.ready[sn.ID])
	m.pool.mu.Unlock()
	m.pool.poke()
	return PoolStatus{Pool: cfg, Ready: ready}, nil
}

// Pool returns snapshot ref's warm pool (size 0: none).
func (m *Manager) Pool(ctx context.Context, ref string) (PoolStatus, error) {
	sn, err := m.visibleSnapshot(ctx, ref, authz.Get)
	if err != nil {
		return PoolStatus{}, err
	}
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	cfg, ok := m.pool.cfg[sn.ID]
	if !ok {
		cfg = store.Pool{SnapshotID: sn.ID, WorkspaceID: sn.WorkspaceID}
	}
	return PoolStatus{Pool: cfg, Ready: len(m.pool.ready[sn.ID])}, nil
}

// poolLimits are the limits pool instances boot with (on the default
// runtime): the defaults, in the background (the lowest CPU share, where
// the driver has runtime.CPUWeighter) so refills take only CPU nothing
// else wants; a claim gives the normal share back.
func (m *Manager) poolLimits() runtime.Limits {
	l := m.cfg.Limits
	_, weighs := m.rt.def().(runtime.CPUWeighter)
	return runtime.Limits{MilliCPUs: l.DefaultVCPUs * 1000, MemBytes: l.DefaultMemBytes, PidsMax: l.PidsMax, Background: weighs}
}

// takePooled hands sb (not yet recorded) a ready instance of sn's pool
// when one can serve req, giving sb its id; nil when none can. Each
// instance is taken once: it leaves the ready list under the pool's lock.
func (m *Manager) takePooled(sb *store.Sandbox, sn *store.Snapshot, req protocol.CreateSandboxRequest) *pooled {
	serves := m.poolServes(sb, sn, req, m.poolLimits())
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	if _, ok := m.pool.cfg[sn.ID]; !ok {
		return nil
	}
	ready := m.pool.ready[sn.ID]
	var pi *pooled
	if len(ready) > 0 && serves {
		pi = ready[len(ready)-1] // the youngest: the oldest age out
		m.pool.ready[sn.ID] = ready[:len(ready)-1]
		sb.ID = pi.id
		m.pool.claimed[pi.id] = pi
		m.identify(pi, hostname(sb))
	}
	if o, ok := m.cfg.Observer.(PoolObserver); ok {
		o.PoolClaim(sn.ID, pi != nil)
		o.PoolSize(sn.ID, len(m.pool.ready[sn.ID]))
	}
	m.pool.poke()
	return pi
}

// poolServes reports whether a pool instance booted with limits can
// become sb as req asks: the default runtime (pools boot on it), the same
// vcpus and memory (the runtime does not change them on a running
// instance), no memory image to restore and no mounts.
func (m *Manager) poolServes(sb *store.Sandbox, sn *store.Snapshot, req protocol.CreateSandboxRequest, limits runtime.Limits) bool {
	d := m.rt.def()
	if sb.Runtime != d.Name() || sb.MilliCPUs() != limits.MilliCPUs || sb.MemBytes != limits.MemBytes {
		return false
	}
	if hasJSON(req.MountConfig) || len(sb.Volumes) > 0 || sb.Docker {
		return false // binds and runsc flags are fixed when an instance starts
	}
	mem, err := m.snapshotMemory(d, sn, req.RestoreMemory)
	return err == nil && mem.dir == ""
}

// agentIdentifies reports whether runtime d's agents set their own
// identity (runtime.AgentIdentifier).
func agentIdentifies(d runtime.Driver) bool {
	ai, ok := d.(runtime.AgentIdentifier)
	return ok && ai.AgentSetsIdentity()
}

// canIdentify reports whether a running instance on d can take another
// identity, which a warm pool needs.
func canIdentify(d runtime.Driver) bool {
	_, ok := d.(runtime.Identifier)
	return ok || agentIdentifies(d)
}

// identify starts giving taken instance pi hostname host and a fresh
// machine-id, through its agent where it can (one round trip), else the
// driver; claimPooled collects the result.
func (m *Manager) identify(pi *pooled, host string) {
	pi.takenAt, pi.identified = time.Now(), make(chan error, 1)
	m.goBG(func() {
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Limits.BootTimeout)
		defer cancel()
		d := pi.inst.driver
		if agentIdentifies(d) {
			pi.identified <- pi.inst.client.SetIdentity(ctx, host, randomHex(16))
			return
		}
		pi.identified <- d.(runtime.Identifier).SetIdentity(ctx, runtimeID(pi.id), host, randomHex(16))
	})
}

// discardPooled tears down an instance taken for a record that was never
// stored (a quota refusal): it already bears that record's hostname, so
// it does not go back to the pool.
func (m *Manager) discardPooled(ctx context.Context, pi *pooled) {
	m.pool.mu.Lock()
	delete(m.pool.claimed, pi.id)
	m.pool.mu.Unlock()
	<-pi.identified
	m.teardownPooled(ctx, pi)
}

// adoptPooled ends pi's life as a pool instance once a record holds its
// id: the record, not the pool's row or hold, keeps it from Leftovers.
func (m *Manager) adoptPooled(ctx context.Context, pi *pooled) {
	if err := m.cfg.Store.DeletePoolInstance(ctx, pi.id); err != nil {
		m.log.Warn("forget claimed pool instance", "sandbox", pi.id, "err", err)
	}
	pi.release()
}

// reservedPool reports whether a pool instance waits for sandbox id's boot.
func (m *Manager) reservedPool(id string) bool {
	m.pool.mu.Lock()
	defer m.pool.mu.Unlock()
	return m.pool.claimed[id] != nil
}

// dropClaim tears down the pool instance claimed for sandbox id if its
// boot failed before binding it.
func (m *Manager) dropClaim(ctx context.Context, id string) {
	m.pool.mu.Lock()
	pi := m.pool.claimed[id]
	delete(m.pool.claimed, id)
	m.pool.mu.Unlock()
	if pi != nil {
		<-pi.identified
		m.teardownPooled(ctx, pi)
	}
}

// claimPooled, in boot, turns the pool instance claimed for sb into sb's
// (see the notes above) and returns it, its teardown pushed on undo; nil
// when none was claimed. A claimed instance that cannot take sb's
// identity is torn down and nil returned: the boot goes on cold (seeding
// the identity a cold first boot does).
func (m *Manager) claimPooled(ctx context.Context, undo *cleanup.Stack, sb *store.Sandbox, sn *store.Snapshot, token string) *instance {
	m.pool.mu.Lock()
	pi := m.pool.claimed[sb.ID]
	delete(m.pool.claimed, sb.ID)
	m.pool.mu.Unlock()
	if pi == nil {
		return nil
	}
	// The egress policy attaches while the identity is set; the token
	// turns only after it is (the identity call holds the pool token).
	var err error
	if m.cfg.Egress != nil {
		err = m.cfg.Egress.Attach(ctx, sb.ID, sb.WorkspaceID, pi.inst.ep, sb.ProxyConfig)
	}
	if ierr := <-pi.identified; err == nil {
		err = ierr
	}
	if err == nil {
		err = pi.inst.client.RotateToken(ctx, token)
	}
	if w, ok := pi.inst.driver.(runtime.CPUWeighter); ok && err == nil {
		err = w.SetBackground(ctx, runtimeID(sb.ID), false)
	}
	if err != nil {
		m.log.Warn("claimed pool instance cannot take its record's identity; booting cold", "sandbox", sb.ID, "err", err)
		if cerr := pi.undo.Run(ctx); cerr != nil {
			m.log.Error("tear down pool instance", "sandbox", sb.ID, "err", cerr)
		}
		if err := m.seedIdentity(ctx, runtimeID(sb.ID), sn); err != nil {
			m.log.Warn("seed identity after a failed claim", "sandbox", sb.ID, "err", err)
		}
		return nil
	}
	undo.Push(pi.undo.Run)
	if o, ok := m.cfg.Observer.(PoolObserver); ok {
		o.PoolClaimed(time.Since(pi.takenAt))
	}
	inst := pi.inst
	inst.phases = append(inst.phases, phase{PhaseClaim, pi.takenAt, time.Now()})
	return inst
}

// PhaseClaim is the phase of a boot that binds a warm-pool instance.
const PhaseClaim = "claim"

// preparePooled boots one instance for sn's pool.
func (m *Manager) preparePooled(ctx context.Context, sn *store.Snapshot) (*pooled, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Limits.BootTimeout)
	defer cancel()
	pi := &pooled{id: uuid.NewString(), born: time.Now()}
	rid := runtimeID(pi.id)
	pi.release = m.holdTransient(rid)
	if err := m.cfg.Store.AddPoolInstance(ctx, store.PoolInstance{ID: pi.id, SnapshotID: sn.ID, CreatedAt: pi.born.UTC()}); err != nil {
		pi.release()
		return nil, err
	}
	pi.undo.Push(func(ctx context.Context) error {
		defer pi.release()
		return m.cfg.Store.DeletePoolInstance(ctx, pi.id)
	})
	id := identity{driver: m.rt.def(), id: pi.id, workspace: sn.WorkspaceID, name: "pool-" + rid[:12], hostname: "pool-" + rid[:12],
		token: randomHex(32), limits: m.poolLimits()}
	inst, err := m.prepare(ctx, &pi.undo, sn, true, "", id, sn.FSCapacityBytes+bootReserveBytes)
	if err != nil {
		if cerr := pi.undo.Run(context.WithoutCancel(ctx)); cerr != nil {
			m.log.Error("clean up failed pool boot", "snapshot", sn.ID, "err", cerr)
		}
		return nil, fmt.Errorf("boot pool instance of snapshot %s: %w", sn.ID, err)
	}
	pi.inst = inst
	return pi, nil
}

// StartPools runs the refiller until the manager closes, then tears down
// the ready instances. Call it after Recover.
func (m *Manager) StartPools(ctx context.Context) error {
	cfgs, err := m.cfg.Store.ListPools(ctx)
	if err != nil {
		return err
	}
	m.pool.mu.Lock()
	for _, c := range cfgs {
		m.pool.cfg[c.SnapshotID] = c
	}
	m.pool.mu.Unlock()
	m.goBG(func() {
		t := time.NewTicker(poolRefillTick)
		defer t.Stop()
		for {
			select {
			case <-m.life.Done():
				m.drainPools(context.WithoutCancel(ctx))
				return
			case <-t.C:
			case <-m.pool.wake:
			}
			if m.refillOnce(ctx) {
				m.pool.poke()
			}
		}
	})
	return nil
}

// refillOnce recycles instances past their pool's max age or beyond its
// size and, unless a create is in flight, boots one missing instance. It
// reports whether there is more to do.
func (m *Manager) refillOnce(ctx context.Context) bool {
	var expired []*pooled
	var want store.Pool
	m.pool.mu.Lock()
	for snap, ready := range m.pool.ready {
		cfg := m.pool.cfg[snap]
		keep := ready[:0]
		for _, pi := range ready {
			old := cfg.MaxAgeSeconds > 0 && time.Since(pi.born) >= time.Duration(cfg.MaxAgeSeconds)*time.Second
			if old || int64(len(keep)) >= cfg.Size {
				expired = append(expired, pi)
				continue
			}
			keep = append(keep, pi)
		}
		m.pool.ready[snap] = keep
	}
	for snap, cfg := range m.pool.cfg {
		if int64(len(m.pool.ready[snap])) < cfg.Size && m.pool.creating == 0 {
			want = cfg
			break
		}
	}
	m.pool.mu.Unlock()
	for _, pi := range expired {
		m.teardownPooled(ctx, pi)
	}
	if want.Size == 0 || m.closing() {
		return false
	}
	// A refill stops where a create would be refused: pool instances take
	// the host's memory and store space as much as a tenant's do.
	if err := m.gate.room(m.poolLimits().MemBytes); err != nil {
		m.log.Debug("warm pool not refilled", "snapshot", want.SnapshotID, "err", err)
		return false
	}
	sn, err := m.cfg.Store.GetSnapshot(ctx, want.WorkspaceID, want.SnapshotID)
	if err == nil && sn.Status != protocol.SnapshotReady {
		err = fmt.Errorf("snapshot %s is %s", sn.ID, sn.Status)
	}
	var pi *pooled
	if err == nil {
		pi, err = m.preparePooled(ctx, sn)
	}
	if err != nil {
		m.log.Warn("refill warm pool", "snapshot", want.SnapshotID, "err", err)
		return false
	}
	m.pool.mu.Lock()
	m.pool.ready[sn.ID] = append(m.pool.ready[sn.ID], pi)
	n := len(m.pool.ready[sn.ID])
	m.pool.mu.Unlock()
	if o, ok := m.cfg.Observer.(PoolObserver); ok {
		o.PoolSize(sn.ID, n)
	}
	return true
}

func (m *Manager) teardownPooled(ctx context.Context, pi *pooled) {
	if err := pi.undo.Run(ctx); err != nil {
		m.log.Error("tear down pool instance", "id", pi.id, "err", err)
	}
}

// dropPool removes snapshot id's pool and tears its ready instances down
// (the snapshot is being deleted: they stand on its layers). An instance
// still booting joins the ready list and the refiller, finding no pool,
// tears it down.
func (m *Manager) dropPool(ctx context.Context, id string) error {
	if err := m.cfg.Store.PutPool(ctx, store.Pool{SnapshotID: id}); err != nil {
		return err
	}
	m.pool.mu.Lock()
	ready := m.pool.ready[id]
	delete(m.pool.ready, id)
	delete(m.pool.cfg, id)
	m.pool.mu.Unlock()
	for _, pi := range ready {
		m.teardownPooled(ctx, pi)
	}
	return nil
}

// drainPools tears down every ready instance (the manager is closing).
func (m *Manager) drainPools(ctx context.Context) {
	m.pool.mu.Lock()
	var all []*pooled
	for snap, ready := range m.pool.ready {
		all = append(all, ready...)
		delete(m.pool.ready, snap)
	}
	m.pool.mu.Unlock()
	for _, pi := range all {
		m.teardownPooled(ctx, pi)
	}
}

// recoverPools tears down the pool instances a previous daemon left (its
// instances' agents hold tokens nobody knows any more). An instance whose
// id a record adopted is the record's: only its row goes.
func (m *Manager) recoverPools(ctx context.Context) error {
	left, err := m.cfg.Store.ListPoolInstances(ctx)
	if err != nil {
		return err
	}
	for _, pi := range left {
		if _, err := m.cfg.Store.GetSandboxByID(ctx, pi.ID); err != nil {
			if !errdefs.IsNotFound(err) {
				return err
			}
			err := m.takeDown(ctx, m.rt.def(), runtimeID(pi.ID), true)
			m.egressDown(ctx, pi.ID)
			if err != nil {
				return fmt.Errorf("tear down pool instance %s: %w", pi.ID, err)
			}
			m.log.Info("tore down a previous daemon's pool instance", "id", pi.ID, "snapshot", pi.SnapshotID)
		}
		if err := m.cfg.Store.DeletePoolInstance(ctx, pi.ID); err != nil {
			return err
		}
	}
	return nil
}

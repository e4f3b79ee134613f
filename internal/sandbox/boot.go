package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Booting is two halves. prepare brings up an instance — rootfs, netns,
// egress enforcement, runtime, agent answering — from a snapshot and an
// identity; bind ties a prepared instance to its record — limits back to
// fs_capacity_bytes, the ready transition, the agent handed out, the
// watcher and the idle clock. The identity (hostname from the name, agent
// token, resource limits, egress policy, the volumes bound in) is derived
// from the record in one place, identityOf. A warm pool or a
// memory-restored branch prepares instances ahead and binds them to
// records later; the identity the runtime cannot yet change after start
// (hostname, limits, mounts) is what such a pool must still settle at
// bind.

// BootError marks a boot failure caused by the sandbox's configuration or
// image (reported as a creation error), as opposed to an internal fault.
type BootError struct{ Err error }

func (e *BootError) Error() string { return e.Err.Error() }
func (e *BootError) Unwrap() error { return e.Err }

// identity is what makes an instance a particular sandbox's.
type identity struct {
	id, workspace string
	name          string
	hostname      string
	token         string // this instance's fresh agent token
	limits        runtime.Limits
	proxyConfig   []byte
	mounts        []runtime.Mount // host directories bound in (volumes)
	docker        bool            // runtime.Spec.Docker: fixed at start, like limits
	mountConfig   []byte
	driver        runtime.Driver // the runtime the instance runs on
}

// identityOf derives sb's identity for an instance on runtime d with agent
// token token.
func (m *Manager) identityOf(d runtime.Driver, sb *store.Sandbox, token string) identity {
	return identity{
		driver: d, id: sb.ID, workspace: sb.WorkspaceID, name: sb.Name, hostname: hostname(sb), token: token, proxyConfig: sb.ProxyConfig, docker: sb.Docker, mountConfig: sb.MountConfig,
		limits: runtime.Limits{MilliCPUs: sb.MilliCPUs(), MemBytes: sb.MemBytes, PidsMax: m.cfg.Limits.PidsMax},
		mounts: m.volumeMounts(sb),
	}
}

// instance is a prepared, running sandbox instance not yet handed out.
type instance struct {
	driver   runtime.Driver
	rootfs   string
	ep       *network.Endpoint
	client   *agent.Client
	restored bool
	phases   []phase
	note     string // the status message bind records with ready
}

// boot brings sb from provisioning or stopped to ready. On failure it tears
// down whatever it built and records the sandbox as failed (first boot) or
// stopped (restart), keeping the upper dir; the record is written even when
// ctx (the boot timeout, the client) has ended. Callers hold sb's lock.
func (m *Manager) boot(ctx context.Context, sb *store.Sandbox, sn *store.Snapshot) (err error) {
	first := statusOf(sb) == Provisioning
	op := OpStart
	if first {
		op = OpCreate
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Limits.BootTimeout)
	defer cancel()
	ctx, end := m.cfg.Observer.Begin(ctx, op, sb.ID)
	defer func() { end(err) }()
	start := time.Now()
	var undo cleanup.Stack
	defer func() {
		if err == nil {
			return
		}
		if cerr := undo.Run(ctx); cerr != nil {
			m.log.Error("clean up failed boot", "sandbox", sb.ID, "err", cerr)
		}
		m.dropClaim(ctx, sb.ID)
		to, msg := Failed, err.Error()
		if !first {
			to, msg = Stopped, "start failed: "+msg
		}
		if terr := m.transition(ctx, sb, to, msg); terr != nil {
			m.log.Error("record failed boot", "sandbox", sb.ID, "err", terr)
			return
		}
		m.emit(ctx, sb, protocol.EventBootFailed, map[string]any{"first": first, "error": err.Error()})
	}()
	d, err := m.driverOf(sb)
	if err != nil {
		return err
	}
	mem, err := m.bootMemoryOf(ctx, d, sb, sn, first)
	if err != nil {
		return err
	}
	if first && !m.reservedPool(sb.ID) {
		if err := m.seedIdentity(ctx, runtimeID(sb.ID), sn); err != nil {
			return err
		}
	}
	// Every instance gets a fresh agent token, recorded before the agent
	// exists (a re-adopting daemon reads it back): the previous instance's
	// token, and a memory snapshot's, never work on this one.
	token := randomHex(32)
	if err := m.cfg.Store.SetSandboxToken(ctx, sb.ID, token); err != nil {
		return err
	}
	sb.Token = token
	prepared := fault.BootPrepared
	if !first {
		m.cfg.Faults.Hit(fault.StartRecorded)
		prepared = fault.StartPrepared
	}
	// A warm-pool instance claimed for sb takes its identity (pool.go);
	// else the boot's own writes (overlay's work dir, the CA bundle) get a
	// reserve above fs_capacity_bytes, so a sandbox that filled its
	// capacity still boots; bind drops the limit back.
	inst := m.claimPooled(ctx, &undo, sb, sn, token)
	if inst == nil {
		inst, err = m.prepare(ctx, &undo, sn, first, mem.dir, m.identityOf(d, sb, token), sb.FSCapacityBytes+bootReserveBytes)
	}
	if err != nil && mem.fallback {
		m.log.Warn("memory restore failed; booting cold", "sandbox", sb.ID, "err", err)
		if cerr := undo.Run(ctx); cerr != nil {
			m.log.Error("clean up failed restore", "sandbox", sb.ID, "err", cerr)
		}
		rerr := err
		if inst, err = m.prepare(ctx, &undo, sn, first, "", m.identityOf(d, sb, token), sb.FSCapacityBytes+bootReserveBytes); err == nil {
			inst.note = joinNote("memory not restored ("+rerr.Error()+"); booted from its files", inst.note)
		}
	}
	if err != nil {
		return err
	}
	m.cfg.Faults.Hit(prepared)
	if !inst.restored {
		if err := m.runStart(ctx, sb, sn, inst.client); err != nil {
			return &BootError{Err: err}
		}
	}
	if err := m.bind(ctx, sb, inst); err != nil {
		return err
	}
	undo.Release()
	m.emitStarted(ctx, sb, first, inst.restored, time.Since(start))
	if !first {
		m.discardMemory(sb.ID) // restored or stale: a stop image serves one boot
	}
	m.log.InfoContext(ctx, "sandbox ready", append([]any{"sandbox", sb.ID, "name", sb.Name, "runtime", d.Name(),
		"restored", inst.restored, "boot", time.Since(start)}, m.observePhases(ctx, op, inst.phases)...)...)
	return nil
}

// prepare brings up an instance of snapshot sn for identity id: rootfs
// (limited to fsLimit while booting), netns, egress, runtime, agent, in
// one of the host's boot slots (it waits for one until ctx ends). Every
// step pushes its undo on undo. With mem (a memory image's dir, see
// bootMemory) the runtime restores the image instead of starting afresh.
func (m *Manager) prepare(ctx context.Context, undo *cleanup.Stack, sn *store.Snapshot, first bool, mem string, id identity, fsLimit int64) (*instance, error) {
	rid := runtimeID(id.id)
	tQueue := time.Now()
	release, err := m.gate.slot(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	t0 := time.Now()
	restore := mem != ""
	// The netns is made while the rootfs is mounted: neither needs the
	// other.
	type netUp struct {
		ep  *network.Endpoint
		err error
		at  time.Time
	}
	netc := make(chan netUp, 1)
	go func() {
		ep, err := m.cfg.Network.Setup(ctx, rid)
		netc <- netUp{ep, err, time.Now()}
	}()
	rootfs, err := m.mountRootFS(ctx, undo, sn, first, rid, id.id, fsLimit)
	tMount := time.Now()
	up := <-netc
	if up.err == nil {
		undo.Push(func(ctx context.Context) error { return m.cfg.Network.Teardown(ctx, rid) })
	}
	if err != nil {
		return nil, err
	}
	if up.err != nil {
		return nil, fmt.Errorf("set up network: %w", up.err)
	}
	ep, tNetwork := up.ep, up.at
	egressEnv, err := m.egressUp(ctx, id, rootfs, ep)
	if err != nil {
		return nil, err
	}
	undo.Push(func(ctx context.Context) error { m.egressDown(ctx, id.id); return nil })
	binds, err := m.dataMounts(ctx, id)
	if err != nil {
		return nil, err
	}
	if binds != nil {
		undo.Push(func(ctx context.Context) error { return m.cfg.Mounts.Down(ctx, id.id) })
	}
	spec := runtime.Spec{
		ID: rid, RootFS: rootfs, AgentBinary: m.cfg.AgentBinary,
		Env: egressEnv, Token: id.token, Hostname: id.hostname, NetNS: ep.NetNS, Limits: id.limits, Mounts: append(append([]runtime.Mount(nil), id.mounts...), binds...), Docker: id.docker,
	}
	tEgress := time.Now()
	d := id.driver
	if restore {
		if err := d.(runtime.Checkpointer).Restore(ctx, spec, filepath.Join(mem, memoryImageDir)); err != nil {
			return nil, &BootError{Err: fmt.Errorf("restore %s sandbox from its memory image: %w", d.Name(), err)}
		}
	} else if err := d.Start(ctx, spec); err != nil {
		return nil, &BootError{Err: fmt.Errorf("start %s sandbox: %w", d.Name(), err)}
	}
	undo.Push(func(ctx context.Context) error { return d.Stop(ctx, rid) })
	tDriver := time.Now()
	client, err := m.waitAgent(ctx, d, rid, ep.SandboxIP, id.token, mem)
	if err != nil {
		return nil, &BootError{Err: err}
	}
	undo.Push(func(context.Context) error { client.Close(); return nil })
	if restore && first && agentIdentifies(d) {
		// A branch restored from a memory snapshot wakes up with its
		// source's hostname (its machine-id file is already its own, see
		// seedIdentity). An agent captured before it could set it (or
		// without the capability) keeps the source's: logged, not fatal.
		if err := client.SetIdentity(ctx, id.hostname, ""); err != nil {
			m.log.Warn("restored branch keeps its source's hostname", "sandbox", id.id, "err", err)
		}
	}
	tAgent := time.Now()
	return &instance{driver: d, rootfs: rootfs, ep: ep, client: client, restored: restore, note: m.mountsHealth(id.id), phases: []phase{
		{PhaseQueue, tQueue, t0}, {PhaseRootFS, t0, tMount}, {PhaseNetwork, t0, tNetwork}, {PhaseEgress, maxTime(tMount, tNetwork), tEgress},
		{PhaseDriver, tEgress, tDriver}, {PhaseAgent, tDriver, tAgent}}}, nil
}

// mountRootFS prepares and mounts sandbox rid's rootfs from sn's layers,
// limited to fsLimit, and pushes its undo (removed on a first boot, else
// unmounted).
func (m *Manager) mountRootFS(ctx context.Context, undo *cleanup.Stack, sn *store.Snapshot, first bool, rid, id string, fsLimit int64) (string, error) {
	if _, err := m.cfg.Storage.Prepare(ctx, rid); err != nil {
		return "", err
	}
	m.limitFS(ctx, id, fsLimit)
	rootfs, err := m.cfg.Storage.Mount(ctx, rid, sn.Layers)
	if err != nil {
		return "", err
	}
	undo.Push(func(ctx context.Context) error {
		if first {
			return m.cfg.Storage.Remove(ctx, rid)
		}
		return m.cfg.Storage.Unmount(ctx, rid)
	})
	return rootfs, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// bind hands prepared instance inst out as sb's: its filesystem limit
// drops back to fs_capacity_bytes, sb becomes ready, and the instance's
// agent, watcher and idle clock are sb's.
func (m *Manager) bind(ctx context.Context, sb *store.Sandbox, inst *instance) error {
	m.limitFS(ctx, sb.ID, sb.FSCapacityBytes)
	if err := m.transition(ctx, sb, Ready, inst.note); err != nil {
		return err
	}
	m.setAgent(sb.ID, inst.client)
	m.setMounted(sb.ID, sb.Volumes)
	m.watch(ctx, inst.driver, sb.ID, inst.client)
	m.touch(sb.ID)
	return nil
}

// bootReserveBytes is what a sandbox may hold above its fs_capacity_bytes
// while it boots: room for the runtime's own writes (overlay's work dir,
// the CA bundle, btrfs metadata), so a full sandbox still starts and its
// user can delete files. Outside a boot the limit is fs_capacity_bytes.
const bootReserveBytes = 4 << 20

// limitFS caps sandbox id's filesystem at bytes: fs_capacity_bytes is
// enforced, not just recorded, wherever the store can (btrfs qgroups); a
// store that cannot is logged, not fatal.
func (m *Manager) limitFS(ctx context.Context, id string, bytes int64) {
	if enforced, err := m.cfg.Storage.Limit(ctx, runtimeID(id), bytes); err != nil || !enforced {
		m.log.Warn("fs_capacity_bytes not enforced", "sandbox", id, "backend", m.cfg.Storage.Backend(), "err", err)
	}
}

// hostname is the sandbox's UTS hostname: its name when that is a valid
// hostname, else a stable one from its id.
func hostname(sb *store.Sandbox) string {
	for _, r := range sb.Name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return "cubicle-" + runtimeID(sb.ID)[:12]
		}
	}
	return sb.Name
}

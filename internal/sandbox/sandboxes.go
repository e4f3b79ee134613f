package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// CreateSandbox validates req, records a provisioning sandbox (within the
// workspace's quotas) and boots it.
// A sandbox created from a captured snapshot without a proxy_config of its
// own inherits the snapshot's (its source's egress policy).
// With wait, it blocks until the sandbox is ready, failed, or timeout passes
// (then it returns the provisioning record and an error wrapping
// errdefs.ErrTimeout; the boot goes on in the background).
func (m *Manager) CreateSandbox(ctx context.Context, req protocol.CreateSandboxRequest) (*store.Sandbox, error) {
	defer m.pool.busy()()
	sb, sn, err := m.newSandbox(ctx, req)
	if err != nil {
		return nil, err
	}
	admitted, err := m.gate.admit(sb.MemBytes)
	if err != nil {
		return nil, err
	}
	pi := m.takePooled(sb, sn, req)
	if err := m.quota.admit(ctx, sb.WorkspaceID, newSandboxClaim(sb), func() error {
		return m.cfg.Store.CreateSandbox(ctx, sb)
	}); err != nil {
		if pi != nil {
			m.discardPooled(ctx, pi)
		}
		admitted()
		return nil, err
	}
	if pi != nil {
		m.adoptPooled(ctx, pi)
	}
	m.cfg.Faults.Hit(fault.CreateRecorded)
	return m.bootNew(ctx, sb, sn, req, admitted)
}

// checkRuntimeFor refuses what of req runtime d cannot do.
func checkRuntimeFor(d runtime.Driver, req protocol.CreateSandboxRequest) error {
	if err := checkPreserveMemory(d, req.PreserveMemoryOnStop); err != nil {
		return err
	}
	return checkDocker(d, req.Docker)
}

// newSandbox validates req and returns the provisioning record it would
// create, not yet stored, and the snapshot it boots from.
func (m *Manager) newSandbox(ctx context.Context, req protocol.CreateSandboxRequest) (*store.Sandbox, *store.Snapshot, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, nil, err
	}
	lim := m.cfg.Limits
	if req.VCPUs, err = reconcileCPU(req.VCPUs, req.CPUMillicores, lim); err != nil {
		return nil, nil, err
	}
	if err := validateSandboxRequest(req, lim, m.ttlUnit()); err != nil {
		return nil, nil, err
	}
	rc, err := withEnvVars(req.RunConfig, req.EnvVars)
	if err != nil {
		return nil, nil, err
	}
	d, err := m.rt.forCreate(req.Runtime)
	if err != nil {
		return nil, nil, err
	}
	if err := checkRuntimeFor(d, req); err != nil {
		return nil, nil, err
	}
	sn, err := m.resolveSnapshot(ctx, p.WorkspaceID, req)
	if err != nil {
		return nil, nil, err
	}
	if img, ok := m.imageRuntimeFor(req, sn); ok && img != d {
		if err := checkRuntimeFor(img, req); err != nil {
			return nil, nil, err
		}
		d = img
	}
	mem, err := m.snapshotMemory(d, sn, req.RestoreMemory)
	if err != nil {
		return nil, nil, err
	}
	docker, err := dockerOf(d, req.Docker, sn)
	if err != nil {
		return nil, nil, err
	}
	if docker && req.PreserveMemoryOnStop != nil && *req.PreserveMemoryOnStop {
		return nil, nil, dockerKeepsNoMemory("preserve_memory_on_stop")
	}
	if docker && mem.dir != "" {
		return nil, nil, errdefs.Field("docker", "snapshot %s holds a memory image, whose processes run without Docker inside; create with restore_memory: false to boot it cold", sn.Name)
	}
	proxyConfig := proxyConfigOf(req.ProxyConfig, sn)
	if err := m.validateEgress(ctx, proxyConfig); err != nil {
		return nil, nil, err
	}
	mountPaths, err := m.validateMounts(ctx, req.MountConfig, proxyConfig)
	if err != nil {
		return nil, nil, err
	}
	labels, err := layerLabels("labels", sn.Labels, req.Labels)
	if err != nil {
		return nil, nil, err
	}
	vols, err := m.resolveVolumes(ctx, "volumes", req.Volumes)
	if err != nil {
		return nil, nil, err
	}
	if err := volumesClearOfMounts(vols, mountPaths); err != nil {
		return nil, nil, err
	}
	now := time.Now().UTC()
	sb := &store.Sandbox{
		ID: uuid.NewString(), WorkspaceID: p.WorkspaceID, CreatedBy: p.User, Name: req.Name,
		Status: string(Provisioning), SnapshotID: sn.ID, Runtime: d.Name(),
		VCPUs: or(req.VCPUs, lim.DefaultVCPUs), MemBytes: or(req.MemBytes, lim.DefaultMemBytes),
		FSCapacityBytes:        or(req.FSCapacityBytes, sn.FSCapacityBytes),
		IdleTTLSeconds:         or(req.IdleTTLSeconds, lim.DefaultIdleTTLSeconds),
		DeleteAfterStopSeconds: or(req.DeleteAfterStopSeconds, lim.DefaultDeleteAfterStop),
		RunConfig:              rc, Token: randomHex(32), CreatedAt: now, UpdatedAt: now,
		ProxyConfig: proxyConfig, PreserveMemoryOnStop: req.PreserveMemoryOnStop != nil && *req.PreserveMemoryOnStop,
		CPUMillicores: or(req.CPUMillicores, 0), Labels: labels, Persistent: req.Persistent == nil || *req.Persistent,
		Volumes:     vols,
		Docker:      docker,
		MountConfig: mountConfigOf(req.MountConfig),
	}
	if sb.Name == "" {
		sb.Name = "sandbox-" + randomHex(4)
	}
	return sb, sn, nil
}

// bootNew boots recorded sandbox sb from sn in the background and, as
// req asks, waits for it (see CreateSandbox). Its record begins here.
// admitted, the boot's place in the gate (or nil), is given back once
// the boot ends.
func (m *Manager) bootNew(ctx context.Context, sb *store.Sandbox, sn *store.Snapshot, req protocol.CreateSandboxRequest, admitted func()) (*store.Sandbox, error) {
	m.emit(ctx, sb, protocol.EventCreated, createdData(sb))
	ctx = WithRestoreMemory(ctx, req.RestoreMemory)
	done := make(chan error, 1)
	m.goBG(func() {
		if admitted != nil {
			defer admitted()
		}
		bctx := context.WithoutCancel(ctx) // the boot outlives a create that does not wait
		unlock, err := m.lock(bctx, sb.ID)
		if err == nil {
			err = m.boot(bctx, sb, sn)
			unlock()
		}
		done <- err
	})
	wait := req.WaitForReady == nil || *req.WaitForReady
	if !wait {
		return sb, nil
	}
	timeout := 30 * time.Second
	if req.Timeout != nil {
		timeout = time.Duration(*req.Timeout) * time.Second
	}
	select {
	case err := <-done:
		cur, gerr := m.cfg.Store.GetSandboxByID(ctx, sb.ID)
		if gerr != nil {
			return nil, gerr
		}
		if err != nil {
			return cur, fmt.Errorf("boot sandbox %s: %w", sb.Name, err)
		}
		return cur, nil
	case <-time.After(timeout):
		return sb, fmt.Errorf("sandbox %s not ready within %s: %w", sb.Name, timeout, errdefs.ErrTimeout)
	case <-ctx.Done():
		return sb, ctx.Err()
	}
}

func or(v *int64, def int64) int64 {
	if v != nil {
		return *v
	}
	return def
}

// visible loads a sandbox by id or name if the caller may perform op on
// it (authz): with no access it gets ErrNotFound, exactly as for a
// sandbox that does not exist; with too little, ErrForbidden.
func (m *Manager) visible(ctx context.Context, name string, op authz.Op) (*store.Sandbox, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	// The OpenAPI docs let a sandbox be named by its id too; the id wins.
	sb, err := m.Resolve(ctx, p.WorkspaceID, name)
	if err != nil {
		return nil, err
	}
	if err := m.checkSandbox(ctx, p, sb, op, name); err != nil {
		return nil, err
	}
	m.touch(sb.ID)
	return sb, nil
}

// lockVisible loads sandbox name for the caller if it may perform op,
// takes its lifecycle lock and reloads the record under it (it may have
// changed while waiting). The caller must call unlock.
func (m *Manager) lockVisible(ctx context.Context, name string, op authz.Op) (sb *store.Sandbox, unlock func(), err error) {
	if sb, err = m.visible(ctx, name, op); err != nil {
		return nil, nil, err
	}
	return m.lockID(ctx, sb.ID)
}

// lockID takes sandbox id's lifecycle lock with ctx and loads its record
// under it. The caller must call unlock.
func (m *Manager) lockID(ctx context.Context, id string) (sb *store.Sandbox, unlock func(), err error) {
	if unlock, err = m.lock(ctx, id); err != nil {
		return nil, nil, fmt.Errorf("wait for sandbox %s: %w", id, err)
	}
	if sb, err = m.cfg.Store.GetSandboxByID(ctx, id); err != nil {
		unlock()
		return nil, nil, err
	}
	return sb, unlock, nil
}

// GetSandbox returns a sandbox by name (or id). Like every call naming a
// sandbox, it counts as activity.
func (m *Manager) GetSandbox(ctx context.Context, name string) (*store.Sandbox, error) {
	sb, err := m.visible(ctx, name, authz.Get)
	if err != nil {
		return nil, err
	}
	m.liveMountsHealth(sb)
	return sb, nil
}

// ListSandboxes lists the sandboxes the caller may see.
func (m *Manager) ListSandboxes(ctx context.Context, o store.ListOptions) ([]*store.Sandbox, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	o.VisibleTo = authz.ListFilter(p)
	return m.cfg.Store.ListSandboxes(ctx, p.WorkspaceID, o)
}

// StopSandbox stops a ready sandbox, keeping its filesystem, and returns
// the stopped record. Stopping a stopped sandbox is a no-op (the official
// client marks the sandbox stopped locally whatever it gets back, so
// idempotence is what it expects); stopping one that is provisioning or
// failed is a conflict.
func (m *Manager) StopSandbox(ctx context.Context, name string) (*store.Sandbox, error) {
	sb, unlock, err := m.lockVisible(ctx, name, authz.StopStart)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := requireStatus(sb, opStop); err != nil {
		return nil, err
	}
	if statusOf(sb) == Stopped {
		return sb, nil
	}
	if err := m.stop(ctx, sb, ""); err != nil {
		return sb, err
	}
	m.emit(ctx, sb, protocol.EventStopped, stopReason{Reason: protocol.StopAPI})
	return sb, nil
}

// halt stops sb's processes and network, unmounts its rootfs and records it
// stopped with msg as its status message. Callers hold sb's lock.
func (m *Manager) halt(ctx context.Context, sb *store.Sandbox, msg string) (err error) {
	ctx, end := m.cfg.Observer.Begin(ctx, OpStop, sb.ID)
	defer func() { end(err) }()
	rid := runtimeID(sb.ID)
	m.setAgent(sb.ID, nil)
	if err := stopOn(ctx, m.servedDriver(sb), rid); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", sb.Name, err)
	}
	m.setMounted(sb.ID, nil)
	if err := m.cfg.Network.Teardown(ctx, rid); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", sb.Name, err)
	}
	m.egressDown(ctx, sb.ID)
	m.dataMountsDown(ctx, sb, false)
	if err := m.cfg.Storage.Unmount(ctx, rid); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", sb.Name, err)
	}
	m.cfg.Faults.Hit(fault.StopHalted)
	return m.transition(ctx, sb, Stopped, msg)
}

// takeDown tears down instance rid: its runtime's on d (nil: none, see
// servedDriver), its netns and address, and its rootfs (unmounted, its
// files kept; with remove, deleted). Each step runs whatever the others
// did; their errors are joined.
func (m *Manager) takeDown(ctx context.Context, d runtime.Driver, rid string, remove bool) error {
	fsDown := m.cfg.Storage.Unmount
	if remove {
		fsDown = m.cfg.Storage.Remove
	}
	return errors.Join(stopOn(ctx, d, rid), m.cfg.Network.Teardown(ctx, rid), fsDown(ctx, rid))
}

// stopOn stops instance rid on d; nil (a runtime not served) has none.
func stopOn(ctx context.Context, d runtime.Driver, rid string) error {
	if d == nil {
		return nil
	}
	return d.Stop(ctx, rid)
}

// StartSandbox boots a stopped sandbox on its existing filesystem (or a
// failed one afresh from its snapshot), waits until it is ready and
// returns the record. Starting a ready sandbox is a no-op, and so is
// starting one still provisioning: the official client's start() polls the
// status afterwards, so a 409 there would break sandbox.start() on a box
// that is simply already up. ctx may carry restore_memory
// (WithRestoreMemory).
func (m *Manager) StartSandbox(ctx context.Context, name string) (*store.Sandbox, error) {
	sb, err := m.visible(ctx, name, authz.StopStart)
	if err != nil {
		return nil, err
	}
	if err := m.wake(ctx, sb.ID, true); err != nil {
		return nil, err
	}
	return m.cfg.Store.GetSandboxByID(ctx, sb.ID)
}

// wake boots sandbox id if it is stopped. explicit (a start request) also
// reboots a failed sandbox and accepts a provisioning one; a dataplane
// wake-up reports those as not ready.
func (m *Manager) wake(ctx context.Context, id string, explicit bool) error {
	sb, unlock, err := m.lockID(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	o := opWake
	if explicit {
		o = opStart
	}
	if err := requireStatus(sb, o); err != nil {
		return err
	}
	if s := statusOf(sb); s == Ready || s == Provisioning {
		return nil
	}
	// Over the workspace's running quotas or the host's capacity, it
	// stays as it is.
	admitted, err := m.gate.admit(sb.MemBytes)
	if err != nil {
		return err
	}
	defer admitted()
	release, err := m.quota.reserve(ctx, sb.WorkspaceID, runClaim(sb))
	if err != nil {
		return err
	}
	defer release()
	if statusOf(sb) == Failed {
		// Its first boot failed: boot it again as a first boot.
		if err := m.transition(ctx, sb, Provisioning, ""); err != nil {
			return err
		}
	}
	sn, err := m.cfg.Store.GetSnapshot(ctx, sb.WorkspaceID, sb.SnapshotID)
	if err != nil {
		return fmt.Errorf("snapshot of sandbox %s: %w", sb.Name, err)
	}
	if statusOf(sb) == Stopped && !sb.Persistent {
		if err := m.discardWrites(ctx, sb, sn); err != nil {
			return err
		}
	}
	return m.boot(ctx, sb, sn)
}

// discardWrites gives stopped non-persistent sandbox sb the filesystem of
// a first boot from sn: its writes (and any memory image) are dropped.
// Callers hold sb's lock.
func (m *Manager) discardWrites(ctx context.Context, sb *store.Sandbox, sn *store.Snapshot) error {
	rid := runtimeID(sb.ID)
	m.discardMemory(sb.ID)
	if err := m.cfg.Storage.Remove(ctx, rid); err != nil {
		return fmt.Errorf("discard the filesystem of non-persistent sandbox %s: %w", sb.Name, err)
	}
	return m.seedIdentity(ctx, rid, sn)
}

// DeleteSandbox stops a sandbox and removes its record and all its data.
func (m *Manager) DeleteSandbox(ctx context.Context, name string) error {
	sb, unlock, err := m.lockVisible(ctx, name, authz.Delete)
	if err != nil {
		return err
	}
	defer unlock()
	if err := m.destroy(ctx, sb); err != nil {
		return err
	}
	m.emit(ctx, sb, protocol.EventDeleted, map[string]string{"reason": "api"})
	return nil
}

// destroy records sb deleting, removes its instance and data, then its
// record. A teardown that fails leaves it deleting: deleting it again (or
// the next Recover) retries. Callers hold sb's lock.
func (m *Manager) destroy(ctx context.Context, sb *store.Sandbox) error {
	if err := requireStatus(sb, opDelete); err != nil {
		return err
	}
	if err := m.transition(ctx, sb, Deleting, ""); err != nil {
		return err
	}
	rid := runtimeID(sb.ID)
	m.setAgent(sb.ID, nil)
	if err := m.takeDown(ctx, m.servedDriver(sb), rid, true); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", sb.Name, err)
	}
	m.discardMemory(sb.ID)
	m.egressDown(ctx, sb.ID)
	m.dataMountsDown(ctx, sb, true)
	m.cfg.Faults.Hit(fault.DeleteTornDown)
	if err := m.transition(ctx, sb, Gone, ""); err != nil {
		return err
	}
	m.forget(sb.ID)
	return nil
}

// Conn is a dataplane request's handle on a running sandbox.
type Conn struct {
	// Agent talks to the sandbox's agent.
	Agent *agent.Client
	// RunConfig is the sandbox's effective run config (image → snapshot →
	// sandbox), for commands to layer their own on.
	RunConfig protocol.RunConfig
	// Gone is closed when this instance of the sandbox stops or dies, or
	// when the caller's access is cut (Revoked), so relayed streams end
	// instead of hanging on a dead peer or serving a revoked principal.
	Gone <-chan struct{}
	// WorkspaceID is the sandbox's workspace, for its audit record.
	WorkspaceID string

	id      string
	m       *Manager
	release func()
	// grant is who holds the Conn for what, re-checked by Reauthorize.
	grant connGrant
	cut   chan struct{}
	once  sync.Once
}

// Touch records activity (an exec frame, a chunk of a transfer).
func (c *Conn) Touch() { c.m.touch(c.id) }

// DialPort connects to TCP port at the sandbox's own address (a tunnel
// stream). The agent's port is refused: the agent answers the daemon, not
// callers. The address is looked up per call, off the exec path.
func (c *Conn) DialPort(ctx context.Context, port uint16) (net.Conn, error) {
	if !c.PortAllowed(port) {
		return nil, fmt.Errorf("port %d of a sandbox: %w", port, errdefs.ErrForbidden)
	}
	ep, err := c.m.cfg.Network.Lookup(ctx, runtimeID(c.id))
	if err != nil {
		return nil, fmt.Errorf("address of sandbox %s: %w", c.id, err)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", net.JoinHostPort(ep.SandboxIP.String(), strconv.Itoa(int(port))))
}

// PortAllowed reports whether callers may reach port through DialPort.
func (c *Conn) PortAllowed(port uint16) bool { return port != 0 && int(port) != c.m.cfg.AgentPort }

// Release ends the request or stream: until then the sandbox counts as
// active. Safe to call more than once.
func (c *Conn) Release() { c.release() }

// Revoked reports whether the Conn was cut because its principal lost
// access (Gone is then closed).
func (c *Conn) Revoked() bool {
	select {
	case <-c.cut:
		return true
	default:
		return false
	}
}

// Dataplane resolves a dataplane request for sandbox id by the caller in
// ctx: it checks the caller may perform op on the sandbox, wakes it if it
// is stopped, and marks it active until the caller calls Conn.Release.
// Until then the Conn is registered, so revoking the caller's access cuts
// it (Reauthorize).
func (m *Manager) Dataplane(ctx context.Context, id string, op authz.Op) (_ *Conn, err error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	sb, err := m.cfg.Store.GetSandboxByID(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := m.checkSandbox(ctx, p, sb, op, id); err != nil {
		return nil, err
	}
	// Mark the sandbox busy before looking up its instance, so the idle
	// reaper cannot stop it between the lookup and the request's use.
	release, c, gone := m.acquireInstance(id)
	defer func() {
		if err != nil {
			release()
		}
	}()
	if c == nil {
		if err := m.wake(ctx, id, false); err != nil {
			return nil, err
		}
		if c, gone = m.instance(id); c == nil {
			return nil, fmt.Errorf("sandbox %s did not start: %w", sb.Name, errdefs.ErrNotReady)
		}
		if sb, err = m.cfg.Store.GetSandboxByID(ctx, id); err != nil {
			return nil, err
		}
	}
	sn, err := m.cfg.Store.GetSnapshot(ctx, sb.WorkspaceID, sb.SnapshotID)
	if err != nil {
		return nil, err
	}
	conn := &Conn{Agent: c, RunConfig: effectiveRunConfig(sn, sb), WorkspaceID: sb.WorkspaceID, id: id, m: m,
		grant: connGrant{p: p, op: op}, cut: make(chan struct{})}
	conn.Gone = m.register(conn, gone, release)
	return conn, nil
}

// effectiveRunConfig is what sb's commands run with: the snapshot's run
// config, then the proxy rules' dummy env_vars, then the sandbox's own,
// which may override them.
func effectiveRunConfig(sn *store.Snapshot, sb *store.Sandbox) protocol.RunConfig {
	return sn.RunConfig.Layer(&protocol.RunConfig{EnvVars: protocol.ProxyEnvVars(sb.ProxyConfig)}).Layer(sb.RunConfig)
}

// StatusMessage returns sandbox id's status message ("" if unknown), for
// errors that need to say why a sandbox went away. It first waits for a
// lifecycle transition in progress: an instance's Conn.Gone closes as its
// halt begins, and the halt records why only as it ends.
func (m *Manager) StatusMessage(ctx context.Context, id string) string {
	m.mu.Lock()
	_, ok := m.boxes[id] // a deleted sandbox must not get its box back
	m.mu.Unlock()
	if ok {
		unlock, err := m.lock(ctx, id)
		if err != nil {
			return ""
		}
		unlock()
	}
	sb, err := m.cfg.Store.GetSandboxByID(ctx, id)
	if err != nil {
		return ""
	}
	return sb.StatusMessage
}

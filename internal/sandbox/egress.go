package sandbox

import (
	"bytes"
	"context"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Egress enforces sandboxes' proxy_config (spec §4.4): access control and
// credential injection. internal/proxy.Service implements it; the manager
// only tells it when a sandbox's network comes and goes and when its config
// changes, and knows nothing of how it is enforced.
type Egress interface {
	// Validate checks a raw proxy_config, returning errdefs.FieldErrors,
	// and that p may use every workspace secret it references
	// (errdefs.ErrForbidden otherwise).
	Validate(ctx context.Context, p auth.Principal, cfg []byte) error
	// Attach enforces cfg (nil: none) for sandbox id of workspace on ep.
	// Idempotent: boot, PATCH and recovery all call it.
	Attach(ctx context.Context, id, workspace string, ep *network.Endpoint, cfg []byte) error
	// Detach forgets sandbox id once its network is gone. Idempotent.
	Detach(ctx context.Context, id string) error
	// PrepareRootFS makes the root filesystem at rootfs (not yet running)
	// trust the proxy's CA and returns environment for its processes.
	PrepareRootFS(ctx context.Context, rootfs string) ([]string, error)
}

// hasJSON reports whether raw (a proxy_config, a mount_config) is given
// rather than absent or null.
func hasJSON(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && string(raw) != "null"
}

// validateEgress checks a proxy_config against the enforcer for the caller
// in ctx, refusing one that cannot be enforced because the daemon runs
// without a proxy. Every path that gives a sandbox a proxy_config (create,
// inherited from a snapshot or fork, PATCH) goes through it under the
// principal asking, so nobody gets a rule using a secret they may not read.
func (m *Manager) validateEgress(ctx context.Context, cfg []byte) error {
	if !hasJSON(cfg) {
		return nil
	}
	if m.cfg.Egress == nil {
		return errdefs.Field("proxy_config", "this server runs without an egress proxy")
	}
	p, err := principalOf(ctx)
	if err != nil {
		return err
	}
	return m.cfg.Egress.Validate(ctx, p, cfg)
}

// egressUp runs in boot between network setup and the driver: it makes
// the rootfs trust the CA and enforces sb's proxy_config before any process
// of the sandbox runs. It returns the environment to add to the sandbox's.
func (m *Manager) egressUp(ctx context.Context, id identity, rootfs string, ep *network.Endpoint) ([]string, error) {
	if m.cfg.Egress == nil {
		if hasJSON(id.proxyConfig) {
			return nil, fmt.Errorf("sandbox %s has a proxy_config but the server runs without an egress proxy: %w", id.name, errdefs.ErrUnavailable)
		}
		return nil, nil
	}
	env, err := m.cfg.Egress.PrepareRootFS(ctx, rootfs)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	if err := m.cfg.Egress.Attach(ctx, id.id, id.workspace, ep, id.proxyConfig); err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	return env, nil
}

// egressDown forgets sb's egress state after its network is torn down.
func (m *Manager) egressDown(ctx context.Context, id string) {
	if m.cfg.Egress == nil {
		return
	}
	if err := m.cfg.Egress.Detach(ctx, id); err != nil {
		m.log.Warn("egress detach", "sandbox", id, "err", err)
	}
}

// egressRestore re-attaches a re-adopted running sandbox after a daemon
// restart (the proxy's state is in memory and its port may have changed).
func (m *Manager) egressRestore(ctx context.Context, sb *store.Sandbox, ep *network.Endpoint) error {
	if m.cfg.Egress == nil {
		return nil
	}
	return m.cfg.Egress.Attach(ctx, sb.ID, sb.WorkspaceID, ep, sb.ProxyConfig)
}

// SetProxyConfig enforces cfg on sandbox id, which must be ready. It does
// not store cfg: UpdateSandbox does, after this succeeds, so a config that
// cannot be enforced is never recorded. Callers hold id's lock.
func (m *Manager) SetProxyConfig(ctx context.Context, id string, cfg []byte) error {
	sb, err := m.cfg.Store.GetSandboxByID(ctx, id)
	if err != nil {
		return err
	}
	if err := requireStatus(sb, opProxy); err != nil {
		return err
	}
	if err := m.validateEgress(ctx, cfg); err != nil {
		return err
	}
	if m.cfg.Egress == nil {
		return nil
	}
	ep, err := m.cfg.Network.Lookup(ctx, runtimeID(sb.ID))
	if err != nil {
		return fmt.Errorf("proxy_config of %s: %w", sb.Name, err)
	}
	return m.cfg.Egress.Attach(ctx, sb.ID, sb.WorkspaceID, ep, cfg)
}

// proxyConfigOf is the stored form of a create request's proxy_config: a
// copy of raw, or when raw is absent (or null) the policy inherited from
// snapshot sn (nil if it has none). Giving one replaces the inherited
// policy, so dropping it takes an explicit {}.
func proxyConfigOf(raw []byte, sn *store.Snapshot) []byte {
	if !hasJSON(raw) {
		raw = sn.ProxyConfig
	}
	if !hasJSON(raw) {
		return nil
	}
	return append([]byte(nil), bytes.TrimSpace(raw)...)
}

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ErrInvalidRequest marks a request the sandbox's current state cannot
// take, where the protocol wants 400 InvalidRequest rather than a 409 —
// today only a proxy_config update of a sandbox that is not ready (the
// official client maps it to LangSmithSandboxNotReadyError).
var ErrInvalidRequest = errors.New("invalid request")

// UpdateSandbox applies a PATCH (spec B4): rename (a clash is ErrConflict),
// TTLs, preserve_memory_on_stop (from the next stop), the sandbox's own
// run_config layer (replaced, it applies to the next command),
// proxy_config (stored as sent; only while ready) and a resize within the
// workspace's quotas (vcpus and mem_bytes apply from the next start, as
// the runtime cannot change a running instance's; fs_capacity_bytes at
// once), and volumes (the attachments, replaced; they apply from the
// next start, see volumes.go). A request that sets nothing returns the
// sandbox unchanged, like GET.
func (m *Manager) UpdateSandbox(ctx context.Context, name string, req protocol.UpdateSandboxRequest) (*store.Sandbox, error) {
	sb, err := m.visible(ctx, name, authz.Update)
	if err != nil {
		return nil, err
	}
	if req.Empty() {
		return sb, nil
	}
	if req.VCPUs, err = reconcileCPU(req.VCPUs, req.CPUMillicores, m.cfg.Limits); err != nil {
		return nil, err
	}
	if err := validateUpdateRequest(req, m.cfg.Limits, m.ttlUnit()); err != nil {
		return nil, err
	}
	d, err := m.driverOf(sb)
	if err != nil {
		return nil, err
	}
	if err := checkPreserveMemory(d, req.PreserveMemoryOnStop); err != nil {
		return nil, err
	}
	sb, unlock, err := m.lockID(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if req.PreserveMemoryOnStop != nil && *req.PreserveMemoryOnStop && !sb.Persistent {
		return nil, errdefs.Field("preserve_memory_on_stop", "requires a persistent sandbox; %s was created with persistent: false", sb.Name)
	}
	var vols []store.VolumeAttachment
	if req.Volumes != nil {
		if vols, err = m.resolveVolumes(ctx, "volumes", *req.Volumes); err != nil {
			return nil, err
		}
	}
	if req.PreserveMemoryOnStop != nil && *req.PreserveMemoryOnStop && sb.Docker {
		return nil, dockerKeepsNoMemory("preserve_memory_on_stop")
	}
	if req.Resizes() {
		// Held until the record is written, which makes the claim visible.
		release, err := m.quota.reserve(ctx, sb.WorkspaceID, resizeClaim(sb, req))
		if err != nil {
			return nil, err
		}
		defer release()
	}
	before := *sb
	proxy := bytes.TrimSpace(req.ProxyConfig)
	proxyChanged := hasJSON(proxy)
	if proxyChanged {
		if err := requireStatus(sb, opProxy); err != nil {
			return nil, err
		}
		if err := m.SetProxyConfig(ctx, sb.ID, proxy); err != nil {
			return nil, err
		}
		sb.ProxyConfig = append([]byte(nil), proxy...)
	}
	if req.Name != nil {
		sb.Name = *req.Name
	}
	if req.IdleTTLSeconds != nil {
		sb.IdleTTLSeconds = *req.IdleTTLSeconds
	}
	if req.DeleteAfterStopSeconds != nil {
		sb.DeleteAfterStopSeconds = *req.DeleteAfterStopSeconds
	}
	if req.PreserveMemoryOnStop != nil {
		sb.PreserveMemoryOnStop = *req.PreserveMemoryOnStop
	}
	if req.RunConfig != nil {
		rc := *req.RunConfig
		sb.RunConfig = &rc
	}
	if req.Labels != nil {
		sb.Labels = req.Labels
	}
	if req.VCPUs != nil {
		// vcpus alone is whole cores; with cpu_millicores, their round-up.
		sb.CPUMillicores = or(req.CPUMillicores, 0)
	}
	sb.VCPUs, sb.MemBytes, sb.FSCapacityBytes = or(req.VCPUs, sb.VCPUs), or(req.MemBytes, sb.MemBytes), or(req.FSCapacityBytes, sb.FSCapacityBytes)
	sb.UpdatedAt = time.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	if req.Volumes != nil {
		if err := m.setVolumes(ctx, sb, vols); err != nil {
			return nil, err
		}
	}
	if req.FSCapacityBytes != nil && statusOf(sb) == Ready {
		m.limitFS(ctx, sb.ID, sb.FSCapacityBytes)
	}
	if sb.Name != before.Name {
		m.emit(ctx, sb, protocol.EventRenamed, map[string]string{"from": before.Name, "to": sb.Name})
	}
	if d := policyDiff(&before, req, proxyChanged); d != nil {
		m.emit(ctx, sb, protocol.EventPolicyChanged, d)
	}
	return sb, nil
}

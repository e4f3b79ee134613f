package sandbox

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ErrInvalidRequest marks a request the sandbox's current state cannot
// take, where the protocol wants 400 InvalidRequest rather than a 409 —
// today only a proxy_config update of a sandbox that is not ready (the
// official client maps it to LangSmithSandboxNotReadyError).
var ErrInvalidRequest = errors.New("invalid request")

// UpdateSandbox applies a PATCH (spec B4): rename (a clash is ErrConflict),
// TTLs, the sandbox's own run_config layer (replaced, it applies to the
// next command) and proxy_config (stored as sent; only while ready). A
// request that sets nothing returns the sandbox unchanged, like GET.
func (m *Manager) UpdateSandbox(ctx context.Context, name string, req protocol.UpdateSandboxRequest) (*store.Sandbox, error) {
	sb, err := m.visible(ctx, name, authz.Update)
	if err != nil {
		return nil, err
	}
	if req.Empty() {
		return sb, nil
	}
	if err := validateUpdateRequest(req, m.ttlUnit()); err != nil {
		return nil, err
	}
	sb, unlock, err := m.lockID(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	proxy := bytes.TrimSpace(req.ProxyConfig)
	if len(proxy) > 0 && string(proxy) != "null" {
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
	if req.RunConfig != nil {
		rc := *req.RunConfig
		sb.RunConfig = &rc
	}
	sb.UpdatedAt = time.Now().UTC()
	if err := m.cfg.Store.UpdateSandbox(ctx, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

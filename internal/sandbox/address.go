package sandbox

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/google/uuid"
)

// This file is the narrow hook the service gateway (internal/gateway) and
// signed download links use. Their requests carry no API key: a signed token
// has already named the workspace and sandbox, so these methods look
// sandboxes up by workspace rather than by principal. They never change a
// record except through wake.

// Resolve returns sandbox ref — its id, or its name within workspaceID — if
// it belongs to workspaceID. It does not wake the sandbox. A sandbox of
// another workspace is reported as not found, as if it did not exist.
func (m *Manager) Resolve(ctx context.Context, workspaceID, ref string) (*store.Sandbox, error) {
	if _, err := uuid.Parse(ref); err == nil {
		sb, err := m.cfg.Store.GetSandboxByID(ctx, ref)
		if err == nil && sb.WorkspaceID == workspaceID {
			return sb, nil
		}
		if err != nil && !errdefs.IsNotFound(err) {
			return nil, err
		}
	}
	if workspaceID == "" {
		return nil, fmt.Errorf("sandbox %s: %w", ref, errdefs.ErrNotFound)
	}
	return m.cfg.Store.GetSandbox(ctx, workspaceID, ref)
}

// Address returns the IP at which the daemon reaches running sandbox id, and
// a channel closed when that instance stops, dies or is deleted (after which
// the address may be reused). A stopped sandbox is booted first, as any
// dataplane request would. The caller must already have authorized access
// and should hold Acquire for as long as it uses the address.
func (m *Manager) Address(ctx context.Context, id string) (netip.Addr, <-chan struct{}, error) {
	c, gone := m.instance(id)
	if c == nil {
		if err := m.wake(ctx, id, false); err != nil {
			return netip.Addr{}, nil, err
		}
		if c, gone = m.instance(id); c == nil {
			return netip.Addr{}, nil, fmt.Errorf("sandbox %s did not start: %w", id, errdefs.ErrNotReady)
		}
	}
	ep, err := m.cfg.Network.Lookup(ctx, runtimeID(id))
	if err != nil {
		return netip.Addr{}, nil, fmt.Errorf("address of sandbox %s: %w", id, err)
	}
	return ep.SandboxIP, gone, nil
}

// Acquire marks a gateway request or connection (a WebSocket, say) on
// sandbox id as open until release is called, so the idle TTL does not stop
// a sandbox whose service is in use. Call it before Address, so the sandbox
// cannot be reaped between the lookup and the request.
func (m *Manager) Acquire(id string) (release func()) { return m.acquire(id) }

// GrantDataplane is Dataplane for a download authorized by a signed link
// instead of an API key: the link acts with the rights of the sandbox's
// creator, and only within workspaceID. It wakes a stopped sandbox.
func (m *Manager) GrantDataplane(ctx context.Context, workspaceID, id string) (*Conn, error) {
	sb, err := m.Resolve(ctx, workspaceID, id)
	if err != nil {
		return nil, err
	}
	p := auth.Principal{WorkspaceID: sb.WorkspaceID, User: sb.CreatedBy}
	return m.Dataplane(auth.WithPrincipal(ctx, p), sb.ID, authz.DownloadFile)
}

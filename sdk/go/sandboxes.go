package cubicle

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// CreateSandbox creates a sandbox. With req.WaitForReady unset or true the
// server blocks until the sandbox is ready (up to req.Timeout seconds, 408 on
// expiry); with it false the sandbox comes back "provisioning" and
// WaitSandbox can follow it. Neither SnapshotID nor SnapshotName boots the
// server's default snapshot.
func (c *Client) CreateSandbox(ctx context.Context, req protocol.CreateSandboxRequest) (*protocol.Sandbox, error) {
	var sb protocol.Sandbox
	if err := c.do(ctx, http.MethodPost, "/boxes", req, &sb); err != nil {
		if req.Name != "" {
			return nil, fmt.Errorf("create sandbox %q: %w", req.Name, err)
		}
		return nil, fmt.Errorf("create sandbox: %w", err)
	}
	c.rememberDataplane(&sb)
	return &sb, nil
}

// GetSandbox returns the sandbox called name.
func (c *Client) GetSandbox(ctx context.Context, name string) (*protocol.Sandbox, error) {
	var sb protocol.Sandbox
	if err := c.do(ctx, http.MethodGet, "/boxes/"+escape(name), nil, &sb); err != nil {
		return nil, fmt.Errorf("get sandbox %q: %w", name, err)
	}
	c.rememberDataplane(&sb)
	return &sb, nil
}

// ListSandboxes returns one page of sandboxes. Sandboxes is always filled,
// from items when the server sends only that field.
func (c *Client) ListSandboxes(ctx context.Context, opts ListOptions) (*protocol.SandboxList, error) {
	var l protocol.SandboxList
	if err := c.do(ctx, http.MethodGet, "/boxes"+opts.query(), nil, &l); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	if l.Sandboxes == nil {
		l.Sandboxes = l.Items
	}
	return &l, nil
}

// UpdateSandbox changes the sandbox called name (PATCH: absent fields are
// left as they are) and returns it as it now is. A rename moves the cached
// dataplane to the new name.
func (c *Client) UpdateSandbox(ctx context.Context, name string, req protocol.UpdateSandboxRequest) (*protocol.Sandbox, error) {
	var sb protocol.Sandbox
	if err := c.do(ctx, http.MethodPatch, "/boxes/"+escape(name), req, &sb); err != nil {
		return nil, fmt.Errorf("update sandbox %q: %w", name, err)
	}
	if sb.Name != name {
		c.forgetDataplane(name)
	}
	c.rememberDataplane(&sb)
	return &sb, nil
}

// DeleteSandbox deletes the sandbox called name and forgets its dataplane.
func (c *Client) DeleteSandbox(ctx context.Context, name string) error {
	c.forgetDataplane(name)
	if err := c.do(ctx, http.MethodDelete, "/boxes/"+escape(name), nil, nil); err != nil {
		return fmt.Errorf("delete sandbox %q: %w", name, err)
	}
	return nil
}

// StopSandbox stops the sandbox, keeping its filesystem. Its dataplane URL
// stays valid across stop and start.
func (c *Client) StopSandbox(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/stop", struct{}{}, nil); err != nil {
		return fmt.Errorf("stop sandbox %q: %w", name, err)
	}
	return nil
}

// StartSandbox starts a stopped (or failed) sandbox. The server may return
// before it is ready; follow with WaitSandbox.
func (c *Client) StartSandbox(ctx context.Context, name string) error {
	return c.StartSandboxWith(ctx, name, protocol.StartSandboxRequest{})
}

// StartSandboxWith is StartSandbox with options (restore_memory).
func (c *Client) StartSandboxWith(ctx context.Context, name string, req protocol.StartSandboxRequest) error {
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/start", req, nil); err != nil {
		return fmt.Errorf("start sandbox %q: %w", name, err)
	}
	return nil
}

// SandboxStatus returns the sandbox's status and status message, a cheaper
// call than GetSandbox.
func (c *Client) SandboxStatus(ctx context.Context, name string) (*protocol.StatusResponse, error) {
	var st protocol.StatusResponse
	if err := c.do(ctx, http.MethodGet, "/boxes/"+escape(name)+"/status", nil, &st); err != nil {
		return nil, fmt.Errorf("sandbox %q status: %w", name, err)
	}
	return &st, nil
}

// WaitSandbox polls the sandbox's status until it is ready, then returns the
// full sandbox. Status "failed" returns an error wrapping ErrSandboxFailed;
// the deadline is ctx's.
func (c *Client) WaitSandbox(ctx context.Context, name string) (*protocol.Sandbox, error) {
	t := time.NewTicker(c.pollInterval)
	defer t.Stop()
	for {
		st, err := c.SandboxStatus(ctx, name)
		if err != nil {
			return nil, err
		}
		switch st.Status {
		case protocol.StatusReady:
			return c.GetSandbox(ctx, name)
		case protocol.StatusFailed:
			return nil, fmt.Errorf("%w: sandbox %q: %s", ErrSandboxFailed, name, st.StatusMessage)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for sandbox %q (last status %q): %w", name, st.Status, ctx.Err())
		case <-t.C:
		}
	}
}

package cubicle

import (
	"context"
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// SandboxStats returns the resource use of the sandbox called name.
func (c *Client) SandboxStats(ctx context.Context, name string) (*protocol.SandboxStats, error) {
	var st protocol.SandboxStats
	if err := c.do(ctx, http.MethodGet, "/boxes/"+escape(name)+"/stats", nil, &st); err != nil {
		return nil, fmt.Errorf("stats of sandbox %q: %w", name, err)
	}
	return &st, nil
}

// ListSandboxStats returns the resource use of every sandbox the key may see.
func (c *Client) ListSandboxStats(ctx context.Context) ([]protocol.SandboxStats, error) {
	var l protocol.SandboxStatsList
	if err := c.do(ctx, http.MethodGet, "/stats", nil, &l); err != nil {
		return nil, fmt.Errorf("list sandbox stats: %w", err)
	}
	return l.Sandboxes, nil
}

package cubicle

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// GetQuota returns workspace ws's quotas (a nil member is unlimited). A
// workspace admin may read its own; the instance admin any.
func (c *Client) GetQuota(ctx context.Context, ws string) (*protocol.WorkspaceQuota, error) {
	var q protocol.WorkspaceQuota
	if err := c.do(ctx, http.MethodGet, "/workspaces/"+escape(ws)+"/quotas", nil, &q); err != nil {
		return nil, fmt.Errorf("get quotas of workspace %q: %w", ws, err)
	}
	return &q, nil
}

// SetQuota replaces workspace ws's quotas: every nil member becomes
// unlimited. Only the instance admin may.
func (c *Client) SetQuota(ctx context.Context, ws string, q protocol.Quota) (*protocol.WorkspaceQuota, error) {
	var out protocol.WorkspaceQuota
	if err := c.do(ctx, http.MethodPut, "/workspaces/"+escape(ws)+"/quotas", q, &out); err != nil {
		return nil, fmt.Errorf("set quotas of workspace %q: %w", ws, err)
	}
	return &out, nil
}

// Usage measures workspace ws against its quotas now.
func (c *Client) Usage(ctx context.Context, ws string) (*protocol.Usage, error) {
	var u protocol.Usage
	if err := c.do(ctx, http.MethodGet, "/workspaces/"+escape(ws)+"/usage", nil, &u); err != nil {
		return nil, fmt.Errorf("get usage of workspace %q: %w", ws, err)
	}
	return &u, nil
}

// IsQuotaExceeded reports whether err is a 429 refusing a request over a
// workspace quota (Type "QuotaExceeded"; the message names the quota).
func IsQuotaExceeded(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests && ae.Type == "QuotaExceeded"
}

// IsRateLimited reports whether err is a 429 for the key's request rate.
func IsRateLimited(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusTooManyRequests && ae.Type == "RateLimited"
}

package cubicle

import (
	"context"
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ShareKind says what a share call names: a sandbox (by name or id) or a
// snapshot (by id).
type ShareKind string

// The kinds of shared resources.
const (
	ShareSandbox  ShareKind = "boxes"
	ShareSnapshot ShareKind = "snapshots"
)

func sharesPath(kind ShareKind, ref string) string {
	return "/" + string(kind) + "/" + escape(ref) + "/shares"
}

// Share grants access ("read" or "use") to a user (req.UserID) or the
// whole workspace (req.Workspace) on sandbox or snapshot ref. Granting
// again to the same grantee changes its access. Only the resource's
// creator and workspace admins may share.
func (c *Client) Share(ctx context.Context, kind ShareKind, ref string, req protocol.ShareRequest) (*protocol.Share, error) {
	var sh protocol.Share
	if err := c.do(ctx, http.MethodPost, sharesPath(kind, ref), req, &sh); err != nil {
		return nil, fmt.Errorf("share %s: %w", ref, err)
	}
	return &sh, nil
}

// ListShares lists the shares of sandbox or snapshot ref, oldest first.
func (c *Client) ListShares(ctx context.Context, kind ShareKind, ref string) ([]protocol.Share, error) {
	var l protocol.ShareList
	if err := c.do(ctx, http.MethodGet, sharesPath(kind, ref), nil, &l); err != nil {
		return nil, fmt.Errorf("list shares of %s: %w", ref, err)
	}
	return l.Shares, nil
}

// Unshare revokes share id of sandbox or snapshot ref. It takes effect at
// once, open exec streams of those who lose access included.
func (c *Client) Unshare(ctx context.Context, kind ShareKind, ref, id string) error {
	if err := c.do(ctx, http.MethodDelete, sharesPath(kind, ref)+"/"+escape(id), nil, nil); err != nil {
		return fmt.Errorf("revoke share %s of %s: %w", id, ref, err)
	}
	return nil
}

package authz

import (
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// ReadQuota returns nil if p may read workspace ws's quotas and usage: an
// admin of ws, or the instance admin. Another workspace's principal gets
// ErrNotFound (workspaces do not leak across); a member of ws, ErrForbidden.
func ReadQuota(p auth.Principal, ws string) error {
	if p.InstanceAdmin || (p.WorkspaceID == ws && p.IsAdmin()) {
		return nil
	}
	return quotaRefusal(p, ws, "reading quotas needs the admin role")
}

// SetQuota returns nil if p may change workspace ws's quotas: only the
// instance admin, since a workspace admin raising its own ceiling would
// defeat it.
func SetQuota(p auth.Principal, ws string) error {
	if p.InstanceAdmin {
		return nil
	}
	return quotaRefusal(p, ws, "changing quotas needs the instance admin")
}

func quotaRefusal(p auth.Principal, ws, why string) error {
	if p.WorkspaceID == "" {
		return fmt.Errorf("%s: %w", why, errdefs.ErrUnauthorized)
	}
	if p.WorkspaceID != ws {
		return fmt.Errorf("workspace %s: %w", ws, errdefs.ErrNotFound)
	}
	return fmt.Errorf("%s: %w", why, errdefs.ErrForbidden)
}

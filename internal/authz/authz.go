// Package authz is Cubicle's one authorization policy: who may see and act
// on what, given the principal an API key names (internal/auth).
//
// The rule is the same everywhere:
//
//   - Nothing crosses a workspace: a principal sees only its own
//     workspace's resources.
//   - A workspace admin sees every resource of the workspace; a member
//     sees the resources it created.
//   - Operations whose effect is workspace-wide (secrets, image names)
//     need the admin role.
//
// A resource a principal may not see is reported as not found, never as
// forbidden, so its existence does not leak; an admin-only operation a
// member attempts is forbidden. Callers map the result to HTTP through
// errdefs as usual.
package authz

import (
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Owned is what the policy needs to know of a resource: its workspace and
// the user who created it.
type Owned struct {
	Workspace string
	CreatedBy string
}

// Sandbox is sb as the policy sees it.
func Sandbox(sb *store.Sandbox) Owned {
	return Owned{Workspace: sb.WorkspaceID, CreatedBy: sb.CreatedBy}
}

// CanSee reports whether p may see (and act on) a resource: same
// workspace, and p is an admin or its creator.
func CanSee(p auth.Principal, r Owned) bool {
	return p.WorkspaceID != "" && p.WorkspaceID == r.Workspace && (p.IsAdmin() || p.User == r.CreatedBy)
}

// CreatorFilter is CanSee as a list filter within p's workspace: the
// creator whose resources p may list, or "" (all of them) for an admin.
// Filtering in the query, not after it, keeps list pages full.
func CreatorFilter(p auth.Principal) string {
	if p.IsAdmin() {
		return ""
	}
	return p.User
}

// See returns nil if p may see resource r, else an ErrNotFound naming what
// (so a member cannot probe for others' resources).
func See(p auth.Principal, r Owned, what string) error {
	if !CanSee(p, r) {
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	}
	return nil
}

// Admin names a workspace-wide operation that needs the admin role.
type Admin string

// The admin-only operations.
const (
	ManageSecrets Admin = "managing workspace secrets"
	LoadImages    Admin = "loading images"
	RemoveImages  Admin = "removing images"
	ReadMetrics   Admin = "reading the daemon's metrics"
)

// Require returns nil if p may perform op: an admin of a workspace. A
// principal without a workspace (no key) is unauthorized.
func Require(p auth.Principal, op Admin) error {
	if p.WorkspaceID == "" {
		return fmt.Errorf("%s needs an API key: %w", op, errdefs.ErrUnauthorized)
	}
	if !p.IsAdmin() {
		return fmt.Errorf("%s needs the admin role: %w", op, errdefs.ErrForbidden)
	}
	return nil
}

// MayUseSecret reports whether p may reference a workspace secret in a
// proxy rule: admins any, members those shared with them.
func MayUseSecret(p auth.Principal, membersMayUse bool) bool {
	return p.IsAdmin() || membersMayUse
}

// AdmitsLogin reports whether p may open a sandbox port granted in login
// mode with access (spec §9.2): any key of the workspace for
// AccessWorkspace, whoever may see the sandbox for AccessRestricted,
// nobody for anything else.
func AdmitsLogin(access string, p auth.Principal, sb Owned) bool {
	switch access {
	case protocol.AccessWorkspace:
		return p.WorkspaceID != "" && p.WorkspaceID == sb.Workspace
	case protocol.AccessRestricted:
		return CanSee(p, sb)
	default:
		return false
	}
}

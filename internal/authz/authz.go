// Package authz is Cubicle's one authorization policy: who may see and act
// on what, given the principal an API key names (internal/auth).
//
// The rule is the same everywhere:
//
//   - Nothing crosses a workspace: a principal sees only its own
//     workspace's resources, whatever its role or shares.
//   - On a sandbox or snapshot a principal holds one access level,
//     none < read < use < owner: owner if it created the resource or is a
//     workspace admin; else what shares grant it (its own share or the
//     workspace-wide one, the higher); else none. Snapshots are private
//     like sandboxes, whether built from an image or captured: an admin
//     shares a snapshot with the workspace to let its members boot it.
//   - Built-in snapshots (store.BuiltinWorkspace: the default computer)
//     belong to the instance, not a workspace: every principal with a
//     workspace holds use on them (list, get, boot, reset onto) and no
//     one owns them, so no key can delete, change or re-share them. A
//     workspace's own snapshot of the same name overrides one by name.
//   - Operations whose effect is workspace-wide (secrets, image names)
//     need the admin role.
//
// What each level allows (Op.Needs; every route asks for its op):
//
//	level  sandbox                                      snapshot
//	read   get, status, list, diff, egress-log,         get, list, diff
//	       service-url (and login-mode service
//	       access), download-url, dataplane download,
//	       glob, grep
//	use    + exec (HTTP and WebSocket), upload, stop,   + create a sandbox from
//	       start, fork, capture                         it, reset onto it
//	owner  + patch, delete, reset, manage shares        + delete, manage shares
//
// read is every operation that changes nothing (file contents included:
// a grep reveals no more than a download); use adds running code and
// writing files; owner adds what destroys, reconfigures or re-shares.
//
// A resource a principal holds no access to is reported as not found,
// with the same error as a missing one, never as forbidden, so its
// existence does not leak. A principal with read (it sees the resource
// already, so a refusal leaks nothing) that asks for more is forbidden; so
// is a member attempting an admin-only operation. Callers map the result to
// HTTP through errdefs as usual.
package authz

import (
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Access is a principal's level on one resource; levels are ordered.
type Access int

// The access levels, lowest first.
const (
	None Access = iota
	Read
	Use
	Owner
)

// Share access values on the wire and in the store.
const (
	ShareRead = "read"
	ShareUse  = "use"
)

func (a Access) String() string {
	switch a {
	case Read:
		return ShareRead
	case Use:
		return ShareUse
	case Owner:
		return "owner"
	default:
		return "none"
	}
}

// ParseShare returns the level a share's access value grants: read or
// use; anything else is not a grantable level (ok false).
func ParseShare(s string) (_ Access, ok bool) {
	switch s {
	case ShareRead:
		return Read, true
	case ShareUse:
		return Use, true
	default:
		return None, false
	}
}

// Owned is what the policy needs to know of a resource: its workspace,
// the user who created it, and the access shares grant the principal
// being checked (None when it has none or was not looked up).
type Owned struct {
	Workspace string
	CreatedBy string
	Shared    Access
}

// Sandbox is sb as the policy sees it (shares not looked up).
func Sandbox(sb *store.Sandbox) Owned {
	return Owned{Workspace: sb.WorkspaceID, CreatedBy: sb.CreatedBy}
}

// Snapshot is sn as the policy sees it (shares not looked up).
func Snapshot(sn *store.Snapshot) Owned {
	return Owned{Workspace: sn.WorkspaceID, CreatedBy: sn.CreatedBy}
}

// Level is p's access to r.
func Level(p auth.Principal, r Owned) Access {
	switch {
	case p.WorkspaceID != "" && r.Workspace == store.BuiltinWorkspace:
		return Use
	case p.WorkspaceID == "" || p.WorkspaceID != r.Workspace:
		return None
	case p.IsAdmin() || p.User == r.CreatedBy:
		return Owner
	default:
		return min(r.Shared, Use)
	}
}

// NeedsShares reports whether p's level on r can depend on shares (so a
// caller looks them up only then): p is of r's workspace but neither its
// creator nor an admin.
func NeedsShares(p auth.Principal, r Owned) bool {
	return p.WorkspaceID != "" && p.WorkspaceID == r.Workspace && !p.IsAdmin() && p.User != r.CreatedBy
}

// Op is an operation on one sandbox or snapshot.
type Op string

// The operations, named as in errors ("<op> needs <level> access").
const (
	Get          Op = "reading"
	Diff         Op = "diffing"
	EgressLog    Op = "reading the egress log of"
	ServiceURL   Op = "opening a service of"
	DownloadURL  Op = "minting a download link to"
	DownloadFile Op = "downloading from"
	SearchFiles  Op = "searching the files of"
	Exec         Op = "running commands in"
	UploadFile   Op = "uploading to"
	StopStart    Op = "stopping or starting"
	Fork         Op = "forking"
	Capture      Op = "capturing"
	Update       Op = "changing"
	Delete       Op = "deleting"
	Reset        Op = "resetting"
	ManageShares Op = "managing the shares of"
	BootSnapshot Op = "creating a sandbox from"
)

// Needs is the level op requires (the table in the package doc).
func (o Op) Needs() Access {
	switch o {
	case Get, Diff, EgressLog, ServiceURL, DownloadURL, DownloadFile, SearchFiles:
		return Read
	case Exec, UploadFile, StopStart, Fork, Capture, BootSnapshot:
		return Use
	default:
		return Owner
	}
}

// Check returns nil if p may perform op on r, named what in errors: an
// ErrNotFound (exactly as if r did not exist) when p has no access, an
// ErrForbidden when it has some but less than op needs.
func Check(p auth.Principal, r Owned, op Op, what string) error {
	switch l := Level(p, r); {
	case l == None:
		return fmt.Errorf("%s: %w", what, errdefs.ErrNotFound)
	case l < op.Needs():
		return fmt.Errorf("%s %s needs %s access; you have %s: %w", op, what, op.Needs(), l, errdefs.ErrForbidden)
	}
	return nil
}

// ListFilter is Level ≥ read as a list filter within p's workspace
// (store.ListOptions.VisibleTo): the user whose own and shared resources
// p may list, or "" (all of them) for an admin. Filtering in the query,
// not after it, keeps list pages full.
func ListFilter(p auth.Principal) string {
	if p.IsAdmin() {
		return ""
	}
	return p.User
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
// AccessWorkspace, whoever holds read access to the sandbox (sb.Shared
// filled in) for AccessRestricted, nobody for anything else.
func AdmitsLogin(access string, p auth.Principal, sb Owned) bool {
	switch access {
	case protocol.AccessWorkspace:
		return p.WorkspaceID != "" && p.WorkspaceID == sb.Workspace
	case protocol.AccessRestricted:
		return Level(p, sb) >= Read
	default:
		return false
	}
}

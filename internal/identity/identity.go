// Package identity manages who may call Cubicle: workspaces, their users,
// and the API keys that act as them; and reads the access audit.
//
// The rules, for the principal in the context (internal/auth):
//
//   - The instance admin (the bootstrap key) creates, lists and deletes
//     workspaces, and manages users and keys in any workspace (a request's
//     workspace_id selects it), so it creates each workspace's first admin.
//   - A workspace admin manages the users and keys of its own workspace
//     and reads its access audit; naming another workspace is forbidden.
//   - A member lists its workspace's users (to share with them), and
//     lists, creates and revokes its own keys, with the member role only.
//   - A key or user the caller may not manage is not found, like any
//     other resource it cannot see; an operation its role does not allow
//     is forbidden.
//   - Instance-admin keys are made only at bootstrap and never revoked
//     through the API (nor their users deleted), so the instance cannot
//     lock itself out.
//
// Every change is recorded in the access audit (accesslog) with an
// Action, in the workspace it changed.
package identity

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/cubicle-dev/cubicle/internal/accesslog"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Forgetter drops cached key lookups (auth.Authenticator), so that a
// revocation takes effect on the next request.
type Forgetter interface{ Forget() }

// Service is the identity API's logic over the store.
type Service struct {
	st    store.Store
	cache Forgetter
	audit accesslog.Recorder
	now   func() time.Time
	// cut ends the open sessions (exec streams, tunnels) of principals
	// that just lost their key; nil cuts nothing.
	cut func(match func(auth.Principal) bool)
}

// CutSessionsWith makes key revocations and user deletions end the open
// sessions of the principals concerned at once, through cut (the sandbox
// manager's CutPrincipals).
func (s *Service) CutSessionsWith(cut func(match func(auth.Principal) bool)) { s.cut = cut }

// cutWhere ends the open sessions of the principals match selects.
func (s *Service) cutWhere(match func(auth.Principal) bool) {
	if s.cut != nil {
		s.cut(match)
	}
}

// MaxKeyLifetime bounds expires_in_seconds (ten years).
const MaxKeyLifetime = 10 * 365 * 24 * time.Hour

// New returns a Service over st that tells cache of revocations and
// records changes in audit.
func New(st store.Store, cache Forgetter, audit accesslog.Recorder) *Service {
	return &Service{st: st, cache: cache, audit: audit, now: time.Now}
}

func principal(ctx context.Context) auth.Principal {
	p, _ := auth.FromContext(ctx)
	return p
}

func forbidden(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrForbidden)...)
}

// record notes an identity change in workspace ws.
func (s *Service) record(ctx context.Context, ws, action, kind, id string) {
	s.audit.Record(ctx, store.AccessRecord{WorkspaceID: ws, Action: action, ResourceKind: kind, Resource: id})
}

// requireAdmin refuses a member.
func requireAdmin(p auth.Principal, what string) error {
	if !p.IsAdmin() && !p.InstanceAdmin {
		return forbidden("%s needs the admin role", what)
	}
	return nil
}

// target resolves the workspace a request acts in: field's value if set
// (another workspace only for the instance admin), else the caller's.
func (s *Service) target(ctx context.Context, field, ws string) (string, error) {
	p := principal(ctx)
	if ws == "" || ws == p.WorkspaceID {
		return p.WorkspaceID, nil
	}
	if !p.InstanceAdmin {
		return "", forbidden("acting in another workspace needs the instance admin key")
	}
	w, err := s.st.GetWorkspace(ctx, ws)
	if errdefs.IsNotFound(err) {
		return "", errdefs.Field(field, "no workspace %q", ws)
	}
	if err != nil {
		return "", err
	}
	return w.ID, nil
}

// Workspace returns workspace ref (id or name) if the caller may see it:
// the instance admin any, others their own.
func (s *Service) Workspace(ctx context.Context, ref string) (*store.Workspace, error) {
	p := principal(ctx)
	w, err := s.st.GetWorkspace(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !p.InstanceAdmin && w.ID != p.WorkspaceID {
		return nil, fmt.Errorf("workspace %s: %w", ref, errdefs.ErrNotFound)
	}
	return w, nil
}

// Workspaces lists what the caller may see: every workspace for the
// instance admin, its own for anyone else.
func (s *Service) Workspaces(ctx context.Context) ([]*store.Workspace, error) {
	p := principal(ctx)
	if p.InstanceAdmin {
		return s.st.ListWorkspaces(ctx)
	}
	w, err := s.st.GetWorkspace(ctx, p.WorkspaceID)
	if err != nil {
		return nil, err
	}
	return []*store.Workspace{w}, nil
}

// CreateWorkspace makes a workspace (instance admin only).
func (s *Service) CreateWorkspace(ctx context.Context, req protocol.CreateWorkspaceRequest) (*store.Workspace, error) {
	if !principal(ctx).InstanceAdmin {
		return nil, forbidden("creating workspaces needs the instance admin key")
	}
	if err := store.ValidateName("name", req.Name); err != nil {
		return nil, err
	}
	w := store.Workspace{ID: uuid.NewString(), Name: req.Name, CreatedAt: s.now().UTC()}
	if err := s.st.CreateWorkspace(ctx, w); err != nil {
		return nil, err
	}
	s.record(ctx, w.ID, "workspace.create", "workspace", w.ID)
	return &w, nil
}

// DeleteWorkspace removes an empty workspace with its users and keys
// (instance admin only).
func (s *Service) DeleteWorkspace(ctx context.Context, ref string) error {
	if !principal(ctx).InstanceAdmin {
		return forbidden("deleting workspaces needs the instance admin key")
	}
	w, err := s.st.GetWorkspace(ctx, ref)
	if err != nil {
		return err
	}
	if err := s.st.DeleteWorkspace(ctx, w.ID); err != nil {
		return err
	}
	s.cache.Forget()
	s.record(ctx, w.ID, "workspace.delete", "workspace", w.ID)
	return nil
}

// checkText validates a free-text field: 1..max printable characters
// (empty allowed unless required).
func checkText(field, v string, max int, required bool) error {
	switch {
	case v == "" && required:
		return errdefs.Field(field, "is required")
	case len(v) > max:
		return errdefs.Field(field, "must be at most %d bytes", max)
	case strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return errdefs.Field(field, "must be printable text")
	}
	return nil
}

// CreateUser adds a user (admins).
func (s *Service) CreateUser(ctx context.Context, req protocol.CreateUserRequest) (*store.User, error) {
	if err := requireAdmin(principal(ctx), "creating users"); err != nil {
		return nil, err
	}
	ws, err := s.target(ctx, "workspace_id", req.WorkspaceID)
	if err != nil {
		return nil, err
	}
	if err := checkText("name", req.Name, 128, true); err != nil {
		return nil, err
	}
	if err := checkText("email", req.Email, 254, false); err != nil {
		return nil, err
	}
	if req.Email != "" && (!strings.Contains(req.Email, "@") || strings.ContainsAny(req.Email, " \t")) {
		return nil, errdefs.Field("email", "must be an email address")
	}
	u := &store.User{ID: uuid.NewString(), WorkspaceID: ws, Name: req.Name, Email: req.Email, CreatedAt: s.now().UTC()}
	if err := s.st.CreateUser(ctx, u); err != nil {
		return nil, err
	}
	s.record(ctx, ws, "user.create", "user", u.ID)
	return u, nil
}

// Users lists the live users of workspace ws ("" the caller's); any key
// of the workspace may, so members can name whom to share with.
func (s *Service) Users(ctx context.Context, ws string) ([]*store.User, error) {
	ws, err := s.target(ctx, "workspace_id", ws)
	if err != nil {
		return nil, err
	}
	return s.st.ListUsers(ctx, ws)
}

// User returns user id of workspace ws ("" the caller's).
func (s *Service) User(ctx context.Context, ws, id string) (*store.User, error) {
	ws, err := s.target(ctx, "workspace_id", ws)
	if err != nil {
		return nil, err
	}
	return s.st.GetUser(ctx, ws, id)
}

// DeleteUser deletes a user and revokes its keys (admins). A user holding
// an instance-admin key cannot be deleted.
func (s *Service) DeleteUser(ctx context.Context, ws, id string) error {
	if err := requireAdmin(principal(ctx), "deleting users"); err != nil {
		return err
	}
	ws, err := s.target(ctx, "workspace_id", ws)
	if err != nil {
		return err
	}
	if _, err := s.st.GetUser(ctx, ws, id); err != nil {
		return err
	}
	keys, err := s.st.ListAPIKeys(ctx, ws, id)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.InstanceAdmin {
			return fmt.Errorf("user %s holds the instance admin key: %w", id, errdefs.ErrConflict)
		}
	}
	if err := s.st.DeleteUser(ctx, ws, id, s.now().UTC()); err != nil {
		return err
	}
	s.cache.Forget()
	s.cutWhere(func(p auth.Principal) bool { return p.WorkspaceID == ws && p.User == id })
	s.record(ctx, ws, "user.delete", "user", id)
	return nil
}

// NewKey is a key just made: its record and its secret, shown once.
type NewKey struct {
	store.APIKey
	Secret string
}

// CreateKey makes an API key. Admins make keys of any role for any user
// of their workspace (the instance admin in any workspace); a member only
// member keys for itself.
func (s *Service) CreateKey(ctx context.Context, req protocol.CreateKeyRequest) (*NewKey, error) {
	p := principal(ctx)
	if req.Role != store.RoleAdmin && req.Role != store.RoleMember {
		return nil, errdefs.Field("role", "must be %q or %q", store.RoleAdmin, store.RoleMember)
	}
	if err := checkText("name", req.Name, 128, false); err != nil {
		return nil, err
	}
	var expires *time.Time
	now := s.now().UTC()
	if req.ExpiresInSeconds != nil {
		secs := *req.ExpiresInSeconds
		if secs <= 0 || secs > int64(MaxKeyLifetime/time.Second) {
			return nil, errdefs.Field("expires_in_seconds", "must be between 1 and %d", int64(MaxKeyLifetime/time.Second))
		}
		t := now.Add(time.Duration(secs) * time.Second)
		expires = &t
	}
	ws, err := s.target(ctx, "workspace_id", req.WorkspaceID)
	if err != nil {
		return nil, err
	}
	user := req.UserID
	if user == "" {
		if ws != p.WorkspaceID {
			return nil, errdefs.Field("user_id", "is required for a key in another workspace")
		}
		user = p.User
	}
	if !p.IsAdmin() && !p.InstanceAdmin && (user != p.User || req.Role != store.RoleMember) {
		return nil, forbidden("a member may create only member keys for itself")
	}
	if _, err := s.st.GetUser(ctx, ws, user); errdefs.IsNotFound(err) {
		return nil, errdefs.Field("user_id", "no user %q in the workspace", user)
	} else if err != nil {
		return nil, err
	}
	secret := auth.NewKey()
	k := store.APIKey{ID: uuid.NewString(), WorkspaceID: ws, User: user, Role: req.Role, Hash: auth.Hash(secret),
		Name: req.Name, Prefix: auth.Prefix(secret), CreatedAt: now, ExpiresAt: expires}
	if err := s.st.PutAPIKey(ctx, k); errdefs.IsNotFound(err) {
		return nil, errdefs.Field("user_id", "user %q was deleted", user)
	} else if err != nil {
		return nil, err
	}
	s.record(ctx, ws, "key.create", "key", k.ID)
	return &NewKey{APIKey: k, Secret: secret}, nil
}

// Keys lists workspace ws's keys ("" the caller's): all of them for an
// admin, the caller's own for a member.
func (s *Service) Keys(ctx context.Context, ws string) ([]*store.APIKey, error) {
	p := principal(ctx)
	ws, err := s.target(ctx, "workspace_id", ws)
	if err != nil {
		return nil, err
	}
	user := ""
	if !p.IsAdmin() && !p.InstanceAdmin {
		user = p.User
	}
	return s.st.ListAPIKeys(ctx, ws, user)
}

// RevokeKey revokes key id of workspace ws ("" the caller's) at once. A
// member may revoke only its own keys (another's is not found).
func (s *Service) RevokeKey(ctx context.Context, ws, id string) error {
	p := principal(ctx)
	ws, err := s.target(ctx, "workspace_id", ws)
	if err != nil {
		return err
	}
	k, err := s.st.GetAPIKey(ctx, ws, id)
	if err != nil {
		return err
	}
	if !p.IsAdmin() && !p.InstanceAdmin && k.User != p.User {
		return fmt.Errorf("api key %s: %w", id, errdefs.ErrNotFound)
	}
	if k.InstanceAdmin {
		return fmt.Errorf("api key %s is the instance admin key: %w", id, errdefs.ErrConflict)
	}
	if err := s.st.RevokeAPIKey(ctx, ws, id, s.now().UTC()); err != nil {
		return err
	}
	s.cache.Forget()
	s.cutWhere(func(p auth.Principal) bool { return p.KeyID == id })
	s.record(ctx, ws, "key.revoke", "key", id)
	return nil
}

// Me is who the caller is.
type Me struct {
	User      *store.User
	Workspace *store.Workspace
}

// WhoAmI returns the caller's user and workspace.
func (s *Service) WhoAmI(ctx context.Context) (*Me, error) {
	p := principal(ctx)
	w, err := s.st.GetWorkspace(ctx, p.WorkspaceID)
	if err != nil {
		return nil, err
	}
	u, err := s.st.GetUser(ctx, p.WorkspaceID, p.User)
	if err != nil {
		return nil, err
	}
	return &Me{User: u, Workspace: w}, nil
}

// AllWorkspaces is the workspace_id with which the instance admin reads
// every workspace's access records (including refused requests no
// workspace could be named for).
const AllWorkspaces = "*"

// Access reads the access audit of workspace q.WorkspaceID (the caller's
// when empty; AllWorkspaces for the instance admin): admins only.
func (s *Service) Access(ctx context.Context, q store.AccessQuery) ([]store.AccessRecord, error) {
	p := principal(ctx)
	if err := requireAdmin(p, "reading the access audit"); err != nil {
		return nil, err
	}
	if q.WorkspaceID == AllWorkspaces {
		if !p.InstanceAdmin {
			return nil, forbidden("reading every workspace's access audit needs the instance admin key")
		}
		q.WorkspaceID = ""
	} else {
		ws, err := s.target(ctx, "workspace_id", q.WorkspaceID)
		if err != nil {
			return nil, err
		}
		q.WorkspaceID = ws
	}
	return s.st.ListAccess(ctx, q)
}

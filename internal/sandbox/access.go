package sandbox

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/google/uuid"
)

// This file applies internal/authz to sandboxes and snapshots: looking up
// the shares a principal holds, managing shares, and cutting open
// dataplane connections whose principal lost access.

// owned is r as the policy sees it for p, with the access p's shares on
// resource (kind, id) grant filled in when they can matter (so an owner's
// or admin's request costs no query).
func (m *Manager) owned(ctx context.Context, p auth.Principal, kind, id string, r authz.Owned) (authz.Owned, error) {
	if !authz.NeedsShares(p, r) {
		return r, nil
	}
	s, err := m.cfg.Store.SharedAccess(ctx, kind, id, p.User)
	if err != nil {
		return r, err
	}
	if a, ok := authz.ParseShare(s); ok {
		r.Shared = max(r.Shared, a)
	}
	return r, nil
}

// SandboxAccess is sb as the policy sees it for p, shares included (the
// gateway's login check).
func (m *Manager) SandboxAccess(ctx context.Context, p auth.Principal, sb *store.Sandbox) (authz.Owned, error) {
	return m.owned(ctx, p, store.ShareSandbox, sb.ID, authz.Sandbox(sb))
}

// checkSandbox is authz.Check of op on sb for p; ref is how the caller
// named it, so a refusal reads exactly like the store's not-found.
func (m *Manager) checkSandbox(ctx context.Context, p auth.Principal, sb *store.Sandbox, op authz.Op, ref string) error {
	r, err := m.SandboxAccess(ctx, p, sb)
	if err != nil {
		return err
	}
	return authz.Check(p, r, op, "sandbox "+ref)
}

// checkSnapshot is checkSandbox for a snapshot.
func (m *Manager) checkSnapshot(ctx context.Context, p auth.Principal, sn *store.Snapshot, op authz.Op, ref string) error {
	r, err := m.owned(ctx, p, store.ShareSnapshot, sn.ID, authz.Snapshot(sn))
	if err != nil {
		return err
	}
	return authz.Check(p, r, op, "snapshot "+ref)
}

// visibleSnapshot loads snapshot id (or name[:tag]) of the caller's workspace if the
// caller may perform op on it (as visible does for sandboxes).
func (m *Manager) visibleSnapshot(ctx context.Context, id string, op authz.Op) (*store.Snapshot, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	sn, err := m.snapshotByRef(ctx, p.WorkspaceID, id)
	if err != nil {
		return nil, err
	}
	return sn, m.checkSnapshot(ctx, p, sn, op, id)
}

// ShareRequest grants a user, or the whole workspace, access to a sandbox
// or snapshot.
type ShareRequest struct {
	// UserID is the grantee, a user of the caller's workspace; "" with
	// Workspace set.
	UserID    string
	Workspace bool
	// Access is "read" or "use".
	Access string
}

// shareTarget resolves the resource a share call names, for the owner
// level: kind is store.ShareSandbox (ref an id or name) or
// store.ShareSnapshot (ref an id).
func (m *Manager) shareTarget(ctx context.Context, kind, ref string) (workspace, id string, err error) {
	if kind == store.ShareSnapshot {
		sn, err := m.visibleSnapshot(ctx, ref, authz.ManageShares)
		if err != nil {
			return "", "", err
		}
		return sn.WorkspaceID, sn.ID, nil
	}
	sb, err := m.visible(ctx, ref, authz.ManageShares)
	if err != nil {
		return "", "", err
	}
	return sb.WorkspaceID, sb.ID, nil
}

// Share grants req on resource (kind, ref). A second grant to the same
// grantee changes its access (and a lowered one takes effect at once, as
// a revocation does).
func (m *Manager) Share(ctx context.Context, kind, ref string, req ShareRequest) (*store.Share, error) {
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := authz.ParseShare(req.Access); !ok {
		return nil, errdefs.Field("access", "must be %q or %q", authz.ShareRead, authz.ShareUse)
	}
	if req.Workspace == (req.UserID != "") {
		return nil, errdefs.Field("user_id", "give either user_id or workspace: true")
	}
	ws, id, err := m.shareTarget(ctx, kind, ref)
	if err != nil {
		return nil, err
	}
	grantee := store.ShareWorkspace
	if !req.Workspace {
		grantee = req.UserID
		ok, err := m.cfg.Store.UserInWorkspace(ctx, ws, grantee)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errdefs.Field("user_id", "no user %q in this workspace", grantee)
		}
	}
	sh := &store.Share{ID: uuid.NewString(), WorkspaceID: ws, ResourceKind: kind, ResourceID: id, Grantee: grantee,
		Access: req.Access, CreatedBy: p.User, CreatedAt: time.Now().UTC()}
	if err := m.cfg.Store.PutShare(ctx, sh); err != nil {
		return nil, err
	}
	if sh.Access == authz.ShareRead {
		m.Reauthorize(ctx)
	}
	return sh, nil
}

// ListShares lists the shares of resource (kind, ref), for its owners.
func (m *Manager) ListShares(ctx context.Context, kind, ref string) ([]*store.Share, error) {
	_, id, err := m.shareTarget(ctx, kind, ref)
	if err != nil {
		return nil, err
	}
	return m.cfg.Store.ListShares(ctx, kind, id)
}

// Unshare revokes share shareID of resource (kind, ref). It takes effect
// at once: open dataplane streams of principals that lose access are cut.
func (m *Manager) Unshare(ctx context.Context, kind, ref, shareID string) error {
	_, id, err := m.shareTarget(ctx, kind, ref)
	if err != nil {
		return err
	}
	if _, err := m.cfg.Store.DeleteShare(ctx, kind, id, shareID); err != nil {
		return err
	}
	m.Reauthorize(ctx)
	return nil
}

// connGrant is who holds an open Conn, and for what.
type connGrant struct {
	p  auth.Principal
	op authz.Op
}

// register records conn as open until release, and returns its Gone: closed
// when the instance goes (gone) or conn is cut.
func (m *Manager) register(conn *Conn, gone <-chan struct{}, release func()) <-chan struct{} {
	out, done := make(chan struct{}), make(chan struct{})
	m.mu.Lock()
	m.conns[conn] = struct{}{}
	m.mu.Unlock()
	go func() {
		select {
		case <-gone:
			close(out)
		case <-conn.cut:
			close(out)
		case <-done:
		}
	}()
	var once sync.Once
	conn.release = func() {
		once.Do(func() {
			m.mu.Lock()
			delete(m.conns, conn)
			m.mu.Unlock()
			close(done)
			release()
		})
	}
	return out
}

// openConns lists the open Conns.
func (m *Manager) openConns() []*Conn {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Conn, 0, len(m.conns))
	for c := range m.conns {
		out = append(out, c)
	}
	return out
}

// OnReauthorize adds fn to what Reauthorize runs after re-checking the
// manager's own Conns (the gateway re-admits its login sessions).
func (m *Manager) OnReauthorize(fn func(context.Context)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reauth = append(m.reauth, fn)
}

// Reauthorize re-checks every open dataplane Conn against the current
// records and shares, and cuts those whose principal may no longer perform
// its operation: their streams end at once and the commands they started
// are killed (the API's exec handlers do that on a cut Gone). Then it runs
// the OnReauthorize hooks. Call it after anything that can take access
// away (a share revoked or lowered).
func (m *Manager) Reauthorize(ctx context.Context) {
	defer func() {
		m.mu.Lock()
		hooks := slices.Clone(m.reauth)
		m.mu.Unlock()
		for _, fn := range hooks {
			fn(ctx)
		}
	}()
	for _, c := range m.openConns() {
		sb, err := m.cfg.Store.GetSandboxByID(ctx, c.id)
		if err == nil {
			err = m.checkSandbox(ctx, c.grant.p, sb, c.grant.op, c.id)
		}
		if errdefs.IsNotFound(err) || errors.Is(err, errdefs.ErrForbidden) {
			c.cutOff()
		} else if err != nil {
			m.log.Warn("re-check dataplane access", "sandbox", c.id, "err", err)
		}
	}
}

// CutPrincipals cuts every open dataplane Conn whose principal matches
// (for instance, those of a revoked key: p.KeyID == id), as Reauthorize
// does.
func (m *Manager) CutPrincipals(match func(auth.Principal) bool) {
	for _, c := range m.openConns() {
		if match(c.grant.p) {
			c.cutOff()
		}
	}
}

func (c *Conn) cutOff() {
	c.once.Do(func() {
		c.m.log.Info("dataplane access cut", "sandbox", c.id, "user", c.grant.p.User, "op", string(c.grant.op))
		close(c.cut)
	})
}

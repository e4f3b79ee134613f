package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// addUser gives p's user a key in its workspace, so it can be a grantee.
func (e *env) addUser(t *testing.T, p auth.Principal) {
	t.Helper()
	if err := e.st.PutAPIKey(context.Background(), store.APIKey{ID: "k-" + p.User, WorkspaceID: p.WorkspaceID, User: p.User,
		Role: p.Role, Hash: "h-" + p.User, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

func wantKind(t *testing.T, what string, err, kind error) {
	t.Helper()
	if kind == nil && err != nil || kind != nil && !errors.Is(err, kind) {
		t.Fatalf("%s: %v, want %v", what, err, kind)
	}
}

// TestShareLevels: a read share lets another member see and download but
// not exec or stop (403, not 404); use adds those; neither lets it delete,
// patch, reset or re-share; a workspace share reaches every member; a
// revoked share is a 404 again. Listing follows the shares.
func TestShareLevels(t *testing.T) {
	e := newEnv(t)
	e.addUser(t, other)
	sb := e.create(t, member, "mine")
	mine, them := as(member), as(other)
	dp := func(op authz.Op) error {
		c, err := e.m.Dataplane(them, sb.ID, op)
		if err == nil {
			c.Release()
		}
		return err
	}
	// level checks what other may do, given what it should have.
	level := func(t *testing.T, have authz.Access) {
		t.Helper()
		want := func(need authz.Access) error {
			switch {
			case have == authz.None:
				return errdefs.ErrNotFound
			case have < need:
				return errdefs.ErrForbidden
			}
			return nil
		}
		_, err := e.m.GetSandbox(them, "mine")
		wantKind(t, "get", err, want(authz.Read))
		wantKind(t, "download", dp(authz.DownloadFile), want(authz.Read))
		wantKind(t, "exec", dp(authz.Exec), want(authz.Use))
		_, err = e.m.StopSandbox(them, "mine")
		wantKind(t, "stop", err, want(authz.Use))
		_, err = e.m.UpdateSandbox(them, "mine", protocol.UpdateSandboxRequest{Name: ptr("x")})
		wantKind(t, "patch", err, want(authz.Owner))
		wantKind(t, "delete", e.m.DeleteSandbox(them, "mine"), want(authz.Owner))
		_, err = e.m.ListShares(them, store.ShareSandbox, "mine")
		wantKind(t, "list shares", err, want(authz.Owner))
		list, err := e.m.ListSandboxes(them, store.ListOptions{})
		if err != nil || (len(list) == 1) != (have != authz.None) {
			t.Fatalf("other lists %d sandboxes with %v: %v", len(list), have, err)
		}
		if _, err := e.m.StartSandbox(mine, "mine"); err != nil {
			t.Fatal(err)
		}
	}
	level(t, authz.None)
	sh, err := e.m.Share(mine, store.ShareSandbox, "mine", ShareRequest{UserID: other.User, Access: "read"})
	if err != nil || sh.Grantee != other.User || sh.Access != "read" || sh.CreatedBy != member.User || sh.ResourceID != sb.ID {
		t.Fatalf("share: %+v %v", sh, err)
	}
	level(t, authz.Read)
	up, err := e.m.Share(mine, store.ShareSandbox, sb.ID, ShareRequest{UserID: other.User, Access: "use"})
	if err != nil || up.ID != sh.ID || up.Access != "use" {
		t.Fatalf("second grant: %+v %v, want share %s with use", up, err, sh.ID)
	}
	level(t, authz.Use)
	if err := e.m.Unshare(mine, store.ShareSandbox, "mine", sh.ID); err != nil {
		t.Fatal(err)
	}
	level(t, authz.None)
	ws, err := e.m.Share(as(admin), store.ShareSandbox, "mine", ShareRequest{Workspace: true, Access: "read"})
	if err != nil || ws.Grantee != store.ShareWorkspace {
		t.Fatalf("workspace share by an admin: %+v %v", ws, err)
	}
	level(t, authz.Read)
	outsider := auth.Principal{WorkspaceID: "ws2", User: other.User, Role: store.RoleAdmin}
	if _, err := e.m.GetSandbox(as(outsider), sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("a workspace share reached another workspace: %v", err)
	}
	if list, _ := e.m.ListShares(mine, store.ShareSandbox, "mine"); len(list) != 1 || list[0].ID != ws.ID {
		t.Fatalf("shares: %+v", list)
	}
}

// TestShareValidation: access must be read or use, the grantee a user of
// the workspace (422 naming user_id either way, so other workspaces' users
// do not leak), and exactly one of user_id and workspace.
func TestShareValidation(t *testing.T) {
	e := newEnv(t)
	e.addUser(t, other)
	e.addUser(t, auth.Principal{WorkspaceID: workspace, User: "ghost"})
	e.create(t, member, "mine")
	for _, c := range []struct {
		req   ShareRequest
		field string
	}{
		{ShareRequest{UserID: other.User, Access: "owner"}, "access"},
		{ShareRequest{UserID: other.User}, "access"},
		{ShareRequest{UserID: "nobody", Access: "read"}, "user_id"},
		{ShareRequest{Access: "read"}, "user_id"},
		{ShareRequest{UserID: other.User, Workspace: true, Access: "read"}, "user_id"},
	} {
		_, err := e.m.Share(as(member), store.ShareSandbox, "mine", c.req)
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("share %+v: %v, want a 422 naming %s", c.req, err, c.field)
		}
	}
	if _, err := e.m.Share(as(other), store.ShareSandbox, "mine", ShareRequest{UserID: other.User, Access: "use"}); !errdefs.IsNotFound(err) {
		t.Fatalf("a member shared someone else's sandbox with itself: %v", err)
	}
}

// TestRevocationCutsOpenConns: revoking a share closes the Gone of the
// grantee's open dataplane Conns at once (Revoked), lowering use to read
// cuts its exec but not its download, and the owner's Conn stays open.
func TestRevocationCutsOpenConns(t *testing.T) {
	e := newEnv(t)
	e.addUser(t, other)
	sb := e.create(t, member, "mine")
	sh, err := e.m.Share(as(member), store.ShareSandbox, "mine", ShareRequest{UserID: other.User, Access: "use"})
	if err != nil {
		t.Fatal(err)
	}
	open := func(p auth.Principal, op authz.Op) *Conn {
		t.Helper()
		c, err := e.m.Dataplane(as(p), sb.ID, op)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		return c
	}
	owner, exec, read := open(member, authz.Exec), open(other, authz.Exec), open(other, authz.DownloadFile)
	hooked := 0
	e.m.OnReauthorize(func(context.Context) { hooked++ })
	if _, err := e.m.Share(as(member), store.ShareSandbox, "mine", ShareRequest{UserID: other.User, Access: "read"}); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(exec.Gone, time.Second) || !exec.Revoked() {
		t.Fatal("lowering the share to read left other's exec open")
	}
	if closedWithin(read.Gone, 50*time.Millisecond) || closedWithin(owner.Gone, 0) {
		t.Fatal("lowering to read cut a download or the owner's exec")
	}
	if err := e.m.Unshare(as(member), store.ShareSandbox, "mine", sh.ID); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(read.Gone, time.Second) || owner.Revoked() {
		t.Fatal("revocation left other's download open, or cut the owner")
	}
	if hooked != 2 {
		t.Fatalf("OnReauthorize hook ran %d times for a lowering and a revocation, want 2", hooked)
	}
	e.m.CutPrincipals(func(p auth.Principal) bool { return p.User == member.User })
	if !closedWithin(owner.Gone, time.Second) {
		t.Fatal("CutPrincipals left a matching Conn open")
	}
	owner.Release()
	owner.Release() // twice is safe
	e.m.mu.Lock()
	n := len(e.m.conns)
	e.m.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d conns registered, want the 2 still unreleased", n)
	}
}

func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// TestSnapshotVisibility: a captured snapshot is its creator's (and
// admins'), like a sandbox, until shared; one built from an image is the
// whole workspace's to read and boot, but only its owner's to delete.
func TestSnapshotVisibility(t *testing.T) {
	e := newEnv(t)
	e.addUser(t, other)
	e.create(t, member, "mine")
	cap, err := e.m.CaptureSnapshot(as(member), "mine", protocol.CaptureSnapshotRequest{Name: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.GetSnapshot(as(other), cap.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("another member got a captured snapshot: %v", err)
	}
	if _, err := e.m.CreateSandbox(as(other), protocol.CreateSandboxRequest{Name: "theirs", SnapshotID: cap.ID}); !errdefs.IsNotFound(err) {
		t.Fatalf("another member booted a captured snapshot: %v", err)
	}
	if list, _ := e.m.ListSnapshots(as(other), store.ListOptions{}); len(list) != 1 || list[0].ID != e.snap.ID {
		t.Fatalf("other lists %v, want only the image-built default", list)
	}
	if err := e.m.DeleteSnapshot(as(other), e.snap.ID); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("a member deleting the admin's image snapshot: %v, want forbidden", err)
	}
	if _, err := e.m.Share(as(member), store.ShareSnapshot, cap.ID, ShareRequest{UserID: other.User, Access: "read"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.GetSnapshot(as(other), cap.ID); err != nil {
		t.Fatalf("get a snapshot shared for read: %v", err)
	}
	if _, err := e.m.CreateSandbox(as(other), protocol.CreateSandboxRequest{Name: "theirs", SnapshotID: cap.ID}); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("boot with read: %v, want forbidden", err)
	}
	if _, err := e.m.Share(as(member), store.ShareSnapshot, cap.ID, ShareRequest{UserID: other.User, Access: "use"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.CreateSandbox(as(other), protocol.CreateSandboxRequest{Name: "theirs", SnapshotID: cap.ID}); err != nil {
		t.Fatalf("boot with use: %v", err)
	}
}

package authz

import (
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

var (
	admin    = auth.Principal{WorkspaceID: "w1", User: "ann", Role: store.RoleAdmin}
	member   = auth.Principal{WorkspaceID: "w1", User: "bob", Role: store.RoleMember}
	other    = auth.Principal{WorkspaceID: "w1", User: "cat", Role: store.RoleMember}
	outsider = auth.Principal{WorkspaceID: "w2", User: "bob", Role: store.RoleAdmin}
	nobody   = auth.Principal{}
	// oddRole has a role that is neither admin nor member: it gets no
	// admin rights.
	oddRole = auth.Principal{WorkspaceID: "w1", User: "dan", Role: "owner"}
)

// TestCanSee: every principal kind against resources of its own and
// another workspace, created by it or by someone else.
func TestCanSee(t *testing.T) {
	bobs := Owned{Workspace: "w1", CreatedBy: "bob"}
	anns := Owned{Workspace: "w1", CreatedBy: "ann"}
	foreign := Owned{Workspace: "w2", CreatedBy: "zed"}
	unowned := Owned{Workspace: "w1"}
	for _, c := range []struct {
		name string
		p    auth.Principal
		r    Owned
		want bool
	}{
		{"creator member sees own", member, bobs, true},
		{"member does not see another's", member, anns, false},
		{"other member does not see bob's", other, bobs, false},
		{"admin sees member's", admin, bobs, true},
		{"admin sees own", admin, anns, true},
		{"admin sees unowned", admin, unowned, true},
		{"member does not see unowned", member, unowned, false},
		{"admin of another workspace sees nothing here", outsider, bobs, false},
		{"same user name in another workspace sees nothing", outsider, bobs, false},
		{"admin does not see another workspace's", admin, foreign, false},
		{"no principal sees nothing", nobody, unowned, false},
		{"no principal sees nothing even unowned in no workspace", nobody, Owned{}, false},
		{"unknown role is not admin", oddRole, anns, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := CanSee(c.p, c.r); got != c.want {
				t.Fatalf("CanSee(%+v, %+v) = %v, want %v", c.p, c.r, got, c.want)
			}
			err := See(c.p, c.r, "sandbox x")
			if c.want != (err == nil) {
				t.Fatalf("See = %v, want allowed=%v", err, c.want)
			}
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				t.Fatalf("See refusal %v is not ErrNotFound (existence must not leak)", err)
			}
		})
	}
}

// TestSandbox: the policy reads a sandbox record's workspace and creator.
func TestSandbox(t *testing.T) {
	sb := &store.Sandbox{WorkspaceID: "w1", CreatedBy: "bob"}
	if got := Sandbox(sb); got != (Owned{Workspace: "w1", CreatedBy: "bob"}) {
		t.Fatalf("Sandbox = %+v", got)
	}
	if !CanSee(member, Sandbox(sb)) || CanSee(other, Sandbox(sb)) {
		t.Fatal("sandbox visibility does not follow its creator")
	}
}

// TestRequire: admin-only operations are forbidden to members and any
// other role, unauthorized without a principal, allowed to admins.
func TestRequire(t *testing.T) {
	for _, op := range []Admin{ManageSecrets, LoadImages, RemoveImages} {
		for _, c := range []struct {
			p    auth.Principal
			want error
		}{
			{admin, nil},
			{outsider, nil},
			{member, errdefs.ErrForbidden},
			{oddRole, errdefs.ErrForbidden},
			{nobody, errdefs.ErrUnauthorized},
		} {
			err := Require(c.p, op)
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Fatalf("Require(%+v, %q) = %v, want %v", c.p, op, err, c.want)
			}
		}
	}
}

// TestMayUseSecret: admins use any secret, members only shared ones.
func TestMayUseSecret(t *testing.T) {
	for _, c := range []struct {
		p      auth.Principal
		shared bool
		want   bool
	}{
		{admin, false, true}, {admin, true, true},
		{member, true, true}, {member, false, false},
		{oddRole, false, false},
	} {
		if got := MayUseSecret(c.p, c.shared); got != c.want {
			t.Fatalf("MayUseSecret(%+v, %v) = %v, want %v", c.p, c.shared, got, c.want)
		}
	}
}

// TestAdmitsLogin: workspace access admits any key of the workspace;
// restricted admits the creator and admins; nothing crosses workspaces;
// an unknown access level admits nobody.
func TestAdmitsLogin(t *testing.T) {
	sb := Owned{Workspace: "w1", CreatedBy: "bob"}
	for _, c := range []struct {
		access string
		p      auth.Principal
		want   bool
	}{
		{protocol.AccessWorkspace, member, true},
		{protocol.AccessWorkspace, other, true},
		{protocol.AccessWorkspace, admin, true},
		{protocol.AccessWorkspace, outsider, false},
		{protocol.AccessWorkspace, nobody, false},
		{protocol.AccessRestricted, member, true},
		{protocol.AccessRestricted, admin, true},
		{protocol.AccessRestricted, other, false},
		{protocol.AccessRestricted, outsider, false},
		{protocol.AccessRestricted, nobody, false},
		{"", admin, false},
		{"public", member, false},
	} {
		if got := AdmitsLogin(c.access, c.p, sb); got != c.want {
			t.Fatalf("AdmitsLogin(%q, %+v) = %v, want %v", c.access, c.p, got, c.want)
		}
	}
}

// TestCreatorFilter: the list filter agrees with CanSee — an admin lists
// every creator's resources, a member (or an unknown role) only its own.
func TestCreatorFilter(t *testing.T) {
	for _, c := range []struct {
		p    auth.Principal
		want string
	}{{admin, ""}, {member, member.User}, {other, other.User}, {oddRole, oddRole.User}} {
		if got := CreatorFilter(c.p); got != c.want {
			t.Errorf("CreatorFilter(%+v) = %q, want %q", c.p, got, c.want)
		}
		for _, creator := range []string{"bob", "ann", c.p.User} {
			listed := c.want == "" || c.want == creator
			if seen := CanSee(c.p, Owned{Workspace: c.p.WorkspaceID, CreatedBy: creator}); seen != listed {
				t.Errorf("%+v: creator %q listed %v but CanSee %v", c.p, creator, listed, seen)
			}
		}
	}
}

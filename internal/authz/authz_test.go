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

// TestLevel: every principal kind against resources of its own and
// another workspace, created by it or not, with and without shares.
func TestLevel(t *testing.T) {
	bobs := Owned{Workspace: "w1", CreatedBy: "bob"}
	anns := Owned{Workspace: "w1", CreatedBy: "ann"}
	annsRead := Owned{Workspace: "w1", CreatedBy: "ann", Shared: Read}
	annsUse := Owned{Workspace: "w1", CreatedBy: "ann", Shared: Use}
	foreign := Owned{Workspace: "w2", CreatedBy: "zed", Shared: Use}
	unowned := Owned{Workspace: "w1"}
	for _, c := range []struct {
		name string
		p    auth.Principal
		r    Owned
		want Access
	}{
		{"creator member owns its own", member, bobs, Owner},
		{"member has nothing on another's", member, anns, None},
		{"member with a read share reads", member, annsRead, Read},
		{"member with a use share uses", member, annsUse, Use},
		{"a share never makes an owner", member, Owned{Workspace: "w1", CreatedBy: "ann", Shared: Owner}, Use},
		{"other member has nothing on bob's", other, bobs, None},
		{"admin owns a member's", admin, bobs, Owner},
		{"admin owns unowned", admin, unowned, Owner},
		{"member has nothing on unowned", member, unowned, None},
		{"admin of another workspace has nothing here", outsider, bobs, None},
		{"a share does not cross workspaces", outsider, Owned{Workspace: "w1", CreatedBy: "ann", Shared: Use}, None},
		{"admin has nothing on another workspace's", admin, foreign, None},
		{"no principal has nothing", nobody, unowned, None},
		{"no principal has nothing even in no workspace", nobody, Owned{Shared: Use}, None},
		{"unknown role is not admin", oddRole, anns, None},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Level(c.p, c.r); got != c.want {
				t.Fatalf("Level(%+v, %+v) = %v, want %v", c.p, c.r, got, c.want)
			}
			if c.want == Owner || c.want == None && c.p.WorkspaceID != c.r.Workspace {
				if NeedsShares(c.p, c.r) {
					t.Fatalf("NeedsShares for a level shares cannot change")
				}
			}
		})
	}
}

// allOps is every operation, with the level the package doc's table gives.
var allOps = map[Op]Access{
	Get: Read, Diff: Read, EgressLog: Read, ServiceURL: Read, DownloadURL: Read, DownloadFile: Read, SearchFiles: Read,
	Exec: Use, UploadFile: Use, StopStart: Use, Fork: Use, Capture: Use, BootSnapshot: Use,
	Update: Owner, Delete: Owner, Reset: Owner, ManageShares: Owner,
}

// TestCheckTable: for every op and every level, Check allows exactly when
// the level reaches the op's, answers not-found with no access (the same
// error text a missing resource gives) and forbidden otherwise.
func TestCheckTable(t *testing.T) {
	for op, need := range allOps {
		if op.Needs() != need {
			t.Errorf("%q needs %v, the table says %v", op, op.Needs(), need)
		}
		for _, c := range []struct {
			p    auth.Principal
			r    Owned
			have Access
		}{
			{other, Owned{Workspace: "w1", CreatedBy: "bob"}, None},
			{other, Owned{Workspace: "w1", CreatedBy: "bob", Shared: Read}, Read},
			{other, Owned{Workspace: "w1", CreatedBy: "bob", Shared: Use}, Use},
			{member, Owned{Workspace: "w1", CreatedBy: "bob"}, Owner},
			{admin, Owned{Workspace: "w1", CreatedBy: "bob"}, Owner},
			{outsider, Owned{Workspace: "w1", CreatedBy: "bob", Shared: Use}, None},
		} {
			err := Check(c.p, c.r, op, "sandbox x")
			switch {
			case c.have >= need && err != nil:
				t.Errorf("%q with %v: %v, want allowed", op, c.have, err)
			case c.have == None && (!errors.Is(err, errdefs.ErrNotFound) || err.Error() != "sandbox x: not found"):
				t.Errorf("%q with no access: %v, want exactly the not-found of a missing sandbox", op, err)
			case c.have != None && c.have < need && !errors.Is(err, errdefs.ErrForbidden):
				t.Errorf("%q with %v: %v, want forbidden", op, c.have, err)
			}
		}
	}
}

// TestSnapshot: snapshots are private until shared, image-built or
// captured (the rule: a member sees what it created or what was
// shared with it); sandboxes carry workspace and creator.
func TestSnapshot(t *testing.T) {
	img := Snapshot(&store.Snapshot{WorkspaceID: "w1", CreatedBy: "ann"})
	captured := Snapshot(&store.Snapshot{WorkspaceID: "w1", CreatedBy: "ann", SourceSandboxID: "s"})
	if Level(member, img) != None || Level(member, captured) != None || Level(outsider, img) != None {
		t.Fatalf("snapshot levels: image %v, captured %v, outsider on image %v", Level(member, img), Level(member, captured), Level(outsider, img))
	}
	if got := Sandbox(&store.Sandbox{WorkspaceID: "w1", CreatedBy: "bob"}); got != (Owned{Workspace: "w1", CreatedBy: "bob"}) {
		t.Fatalf("Sandbox = %+v", got)
	}
}

// TestParseShare: only read and use can be granted.
func TestParseShare(t *testing.T) {
	for s, want := range map[string]Access{"read": Read, "use": Use} {
		if got, ok := ParseShare(s); !ok || got != want || got.String() != s {
			t.Errorf("ParseShare(%q) = %v %v", s, got, ok)
		}
	}
	for _, s := range []string{"", "owner", "none", "USE", "write"} {
		if _, ok := ParseShare(s); ok {
			t.Errorf("ParseShare(%q) accepted", s)
		}
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
	// shared is other with a read share: AdmitsLogin sees it as sb.Shared.
	shared := auth.Principal{WorkspaceID: "w1", User: "eve", Role: store.RoleMember}
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
		{protocol.AccessRestricted, shared, true},
		{protocol.AccessRestricted, outsider, false},
		{protocol.AccessRestricted, nobody, false},
		{"", admin, false},
		{"public", member, false},
	} {
		r := sb
		if c.p == shared {
			r.Shared = Read
		}
		if got := AdmitsLogin(c.access, c.p, r); got != c.want {
			t.Fatalf("AdmitsLogin(%q, %+v) = %v, want %v", c.access, c.p, got, c.want)
		}
	}
}

// TestListFilter: an admin lists everything, a member (or an unknown
// role) what is its own or shared with it.
func TestListFilter(t *testing.T) {
	for _, c := range []struct {
		p    auth.Principal
		want string
	}{{admin, ""}, {member, member.User}, {other, other.User}, {oddRole, oddRole.User}} {
		if got := ListFilter(c.p); got != c.want {
			t.Errorf("ListFilter(%+v) = %q, want %q", c.p, got, c.want)
		}
	}
}

// TestBuiltinSnapshot: a built-in snapshot is usable by every principal
// of every workspace, admins included, and owned by none: booting and
// reading are allowed, deleting, changing and re-sharing forbidden; a
// principal without a workspace still has nothing.
func TestBuiltinSnapshot(t *testing.T) {
	builtin := Snapshot(&store.Snapshot{WorkspaceID: store.BuiltinWorkspace, CreatedBy: "cubicle"})
	for _, p := range []auth.Principal{admin, member, outsider, oddRole} {
		if got := Level(p, builtin); got != Use {
			t.Errorf("Level(%s of %s) = %v, want use", p.User, p.WorkspaceID, got)
		}
		if NeedsShares(p, builtin) {
			t.Errorf("NeedsShares(%s of %s) on a built-in: shares cannot change its level", p.User, p.WorkspaceID)
		}
		for _, op := range []Op{Get, BootSnapshot, Diff} {
			if err := Check(p, builtin, op, "snapshot default"); err != nil {
				t.Errorf("%s %q: %v", p.User, op, err)
			}
		}
		for _, op := range []Op{Delete, Update, ManageShares} {
			if err := Check(p, builtin, op, "snapshot default"); !errors.Is(err, errdefs.ErrForbidden) {
				t.Errorf("%s %q: %v, want forbidden", p.User, op, err)
			}
		}
	}
	if err := Check(nobody, builtin, Get, "snapshot default"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("no principal reading a built-in: %v, want not found", err)
	}
}

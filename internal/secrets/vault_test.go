package secrets

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
)

func TestVault(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	box, err := LoadOrCreate(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "workspace-secrets.json")
	v, err := OpenVault(box, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Put(ctx, "ws1", "API_KEY", []byte("s3cr3t-value"), false); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, []byte("s3cr3t-value")) {
		t.Fatal("plaintext in vault file")
	}
	v2, err := OpenVault(box, path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v2.Secret(ctx, "ws1", "API_KEY")
	if err != nil || string(got) != "s3cr3t-value" {
		t.Fatalf("Secret = %q, %v", got, err)
	}
	if _, err := v2.Secret(ctx, "ws2", "API_KEY"); !errdefs.IsNotFound(err) {
		t.Fatalf("other workspace: %v, want not found", err)
	}
	if l := v2.List(ctx, auth.Principal{WorkspaceID: "ws1", Role: store.RoleAdmin}); len(l) != 1 || l[0].Name != "API_KEY" {
		t.Fatalf("List = %+v", l)
	}
	if err := v2.Delete(ctx, "ws1", "API_KEY"); err != nil {
		t.Fatal(err)
	}
	if err := v2.Delete(ctx, "ws1", "API_KEY"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete: %v", err)
	}
}

// TestVaultMemberGrant: a member may list and reference only the secrets
// an admin flagged members_may_use, in its own workspace; a refusal does
// not tell a missing secret from an ungranted one; a PUT without the flag
// takes the grant back.
func TestVaultMemberGrant(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	box, err := LoadOrCreate(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := OpenVault(box, filepath.Join(dir, "workspace-secrets.json"))
	if err != nil {
		t.Fatal(err)
	}
	admin := auth.Principal{WorkspaceID: "ws1", User: "admin", Role: store.RoleAdmin}
	member := auth.Principal{WorkspaceID: "ws1", User: "bob", Role: store.RoleMember}
	outsider := auth.Principal{WorkspaceID: "ws2", User: "eve", Role: store.RoleMember}
	for name, grant := range map[string]bool{"ADMIN_ONLY": false, "SHARED": true} {
		if _, err := v.Put(ctx, "ws1", name, []byte("v-"+name), grant); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		p    auth.Principal
		name string
		ok   bool
	}{
		{admin, "ADMIN_ONLY", true}, {admin, "NOT_SET_YET", true}, {admin, "SHARED", true},
		{member, "SHARED", true}, {member, "ADMIN_ONLY", false}, {member, "NOT_SET_YET", false},
		{outsider, "SHARED", false},
	} {
		err := v.MayUse(ctx, c.p, c.name)
		if (err == nil) != c.ok || err != nil && !errors.Is(err, errdefs.ErrForbidden) {
			t.Errorf("%s may use %s: %v, want ok=%v", c.p.User, c.name, err, c.ok)
		}
	}
	if l := v.List(ctx, member); len(l) != 1 || l[0].Name != "SHARED" || !l[0].MembersMayUse {
		t.Fatalf("member lists %+v", l)
	}
	if l := v.List(ctx, admin); len(l) != 2 {
		t.Fatalf("admin lists %+v", l)
	}
	if _, err := v.Put(ctx, "ws1", "SHARED", []byte("rotated"), false); err != nil {
		t.Fatal(err)
	}
	if err := v.MayUse(ctx, member, "SHARED"); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("after revoke: %v", err)
	}
}

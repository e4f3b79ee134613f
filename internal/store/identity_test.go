package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestMigrationKeepsKeys builds a database at schema 5 with keys of two
// users (one of them the bootstrap admin) and checks that migrating gives
// each (workspace, user) pair a user row, that the keys still resolve,
// and that only the bootstrap key becomes the instance admin.
func TestMigrationKeepsKeys(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "old.db")
	db := openAtVersion(t, path, 5)
	for _, q := range []string{
		`INSERT INTO workspaces VALUES('default','default','2026-01-01T00:00:00Z'), ('w2','w2','2026-01-01T00:00:00Z')`,
		`INSERT INTO api_keys VALUES('k1','default','admin','admin','h1','2026-01-01T00:00:00Z')`,
		`INSERT INTO api_keys VALUES('k2','default','bob','member','h2','2026-01-02T00:00:00Z')`,
		`INSERT INTO api_keys VALUES('k3','default','bob','member','h3','2026-01-03T00:00:00Z')`,
		`INSERT INTO api_keys VALUES('k4','w2','admin','admin','h4','2026-01-04T00:00:00Z')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	st := openTest(t, path)
	users, err := st.ListUsers(ctx, "default")
	if err != nil || len(users) != 2 || users[0].ID != "admin" || users[1].ID != "bob" || users[1].Name != "bob" {
		t.Fatalf("users of default after migration: %v %v", users, err)
	}
	if u, err := st.GetUser(ctx, "w2", "admin"); err != nil || u.WorkspaceID != "w2" {
		t.Fatalf("user admin of w2: %v %v", u, err)
	}
	for hash, admin := range map[string]bool{"h1": true, "h2": false, "h4": false} {
		k, err := st.APIKeyByHash(ctx, hash)
		if err != nil || k.InstanceAdmin != admin || k.RevokedAt != nil || k.ExpiresAt != nil {
			t.Errorf("key %s after migration: %+v %v (instance admin want %v)", hash, k, err, admin)
		}
	}
}

// openAtVersion creates a database at path with the first n migrations
// applied, as an older daemon left it, and returns it open.
func openAtVersion(t *testing.T, path string, n int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range migrations[:n] {
		if _, err := db.Exec(m); err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", n)); err != nil {
		t.Fatal(err)
	}
	return db
}

func TestKeysUsersWorkspaces(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC().Truncate(time.Millisecond)
	if err := st.CreateWorkspace(ctx, Workspace{ID: "w1", Name: "team", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateWorkspace(ctx, Workspace{ID: "w2", Name: "team", CreatedAt: now}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second workspace named team: %v", err)
	}
	if w, err := st.GetWorkspace(ctx, "team"); err != nil || w.ID != "w1" {
		t.Fatalf("workspace by name: %v %v", w, err)
	}
	if err := st.CreateUser(ctx, &User{ID: "u1", WorkspaceID: "w1", Name: "Ann", Email: "ann@x", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateUser(ctx, &User{ID: "u1", WorkspaceID: "w1", Name: "Dup", CreatedAt: now}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate user id: %v", err)
	}
	exp := now.Add(time.Hour)
	for i, k := range []APIKey{
		{ID: "k1", WorkspaceID: "w1", User: "u1", Role: RoleAdmin, Hash: "h1", Name: "ci", Prefix: "cbk_11111111", CreatedAt: now, ExpiresAt: &exp},
		{ID: "k2", WorkspaceID: "w1", User: "u1", Role: RoleMember, Hash: "h2", CreatedAt: now.Add(time.Second)},
	} {
		if err := st.PutAPIKey(ctx, k); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	k, err := st.GetAPIKey(ctx, "w1", "k1")
	if err != nil || k.Name != "ci" || k.Prefix != "cbk_11111111" || k.ExpiresAt == nil || !k.ExpiresAt.Equal(exp) {
		t.Fatalf("get key: %+v %v", k, err)
	}
	if _, err := st.GetAPIKey(ctx, "w2", "k1"); !errdefs.IsNotFound(err) {
		t.Fatalf("key of another workspace: %v", err)
	}
	if err := st.RevokeAPIKey(ctx, "w1", "k1", now); err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeAPIKey(ctx, "w1", "k1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if k, _ := st.APIKeyByHash(ctx, "h1"); k.RevokedAt == nil || !k.RevokedAt.Equal(now) {
		t.Fatalf("revoked key: %+v (want first revocation time kept)", k)
	}
	five := int64(5)
	if err := st.PutQuota(ctx, "w1", Quota{MaxSandboxes: &five}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteWorkspace(ctx, "w1"); err != nil {
		t.Fatalf("delete empty workspace (users, keys and quotas go with it): %v", err)
	}
	if _, err := st.GetWorkspace(ctx, "w1"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted workspace: %v", err)
	}
}

func TestDeleteUserRevokesKeys(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	if err := st.EnsureWorkspace(ctx, Workspace{ID: "w", Name: "w", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := st.PutAPIKey(ctx, APIKey{ID: fmt.Sprint("k", i), WorkspaceID: "w", User: "bob", Role: RoleMember, Hash: fmt.Sprint("h", i), CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "other", WorkspaceID: "w", User: "ann", Role: RoleMember, Hash: "ho", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteUser(ctx, "w", "bob", now); err != nil {
		t.Fatal(err)
	}
	keys, err := st.ListAPIKeys(ctx, "w", "bob")
	if err != nil || len(keys) != 2 {
		t.Fatalf("bob's keys: %v %v", keys, err)
	}
	for _, k := range keys {
		if k.RevokedAt == nil {
			t.Errorf("key %s of deleted user not revoked", k.ID)
		}
	}
	if k, _ := st.APIKeyByHash(ctx, "ho"); k.RevokedAt != nil {
		t.Error("deleting bob revoked ann's key")
	}
	if _, err := st.GetUser(ctx, "w", "bob"); !errdefs.IsNotFound(err) {
		t.Fatalf("deleted user still found: %v", err)
	}
	if err := st.DeleteUser(ctx, "w", "bob", now); !errdefs.IsNotFound(err) {
		t.Fatalf("delete twice: %v", err)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k9", WorkspaceID: "w", User: "bob", Role: RoleMember, Hash: "h9", CreatedAt: now}); !errdefs.IsNotFound(err) {
		t.Fatalf("new key for a deleted user: %v", err)
	}
}

func TestDeleteWorkspaceRefused(t *testing.T) {
	ctx := context.Background()
	st := openTest(t, filepath.Join(t.TempDir(), "c.db"))
	now := time.Now().UTC()
	for _, ws := range []string{"boxes", "snaps", "admin"} {
		if err := st.CreateWorkspace(ctx, Workspace{ID: ws, Name: ws, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.CreateSnapshot(ctx, &Snapshot{ID: "s1", WorkspaceID: "snaps", Name: "s", Status: protocol.SnapshotReady, CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateSandbox(ctx, &Sandbox{ID: "b1", WorkspaceID: "boxes", Name: "b", SnapshotID: "s1", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutAPIKey(ctx, APIKey{ID: "k", WorkspaceID: "admin", User: "admin", Role: RoleAdmin, Hash: "h", InstanceAdmin: true, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	for _, ws := range []string{"boxes", "snaps", "admin"} {
		if err := st.DeleteWorkspace(ctx, ws); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("delete workspace %s: %v, want a conflict", ws, err)
		}
	}
	if err := st.DeleteWorkspace(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Errorf("delete missing workspace: %v", err)
	}
}

func TestAccessRecords(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "c.db")
	st := openTest(t, path)
	t0 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var recs []AccessRecord
	for i := range 6 {
		ws, sb := "w1", "box"
		if i%2 == 1 {
			ws, sb = "w2", "id-box"
		}
		recs = append(recs, AccessRecord{Time: t0.Add(time.Duration(i) * time.Second), WorkspaceID: ws, UserID: fmt.Sprint("u", i%3),
			KeyPrefix: "cbk_12345678", Method: "GET", Route: "GET /v2/sandboxes/boxes/{name}", ResourceKind: "sandbox", Resource: sb,
			Sandbox: sb, Status: 200, Remote: "127.0.0.1:1", RequestID: fmt.Sprint("r", i)})
	}
	if err := st.AppendAccess(ctx, recs); err != nil {
		t.Fatal(err)
	}
	st.Close()
	st = openTest(t, path)
	all, err := st.ListAccess(ctx, AccessQuery{})
	if err != nil || len(all) != 6 || all[0].RequestID != "r0" || all[5].Seq <= all[0].Seq || !all[1].Time.Equal(t0.Add(time.Second)) {
		t.Fatalf("all records after reopen: %+v %v", all, err)
	}
	page, _ := st.ListAccess(ctx, AccessQuery{WorkspaceID: "w1", Limit: 2})
	if len(page) != 2 || page[0].RequestID != "r0" || page[1].RequestID != "r2" {
		t.Fatalf("first page of w1: %+v", page)
	}
	page, _ = st.ListAccess(ctx, AccessQuery{WorkspaceID: "w1", Limit: 2, After: page[1].Seq})
	if len(page) != 1 || page[0].RequestID != "r4" {
		t.Fatalf("second page of w1: %+v", page)
	}
	if got, _ := st.ListAccess(ctx, AccessQuery{Since: t0.Add(4 * time.Second)}); len(got) != 2 {
		t.Fatalf("since: %+v", got)
	}
	if got, _ := st.ListAccess(ctx, AccessQuery{User: "u0"}); len(got) != 2 || got[1].RequestID != "r3" {
		t.Fatalf("user u0: %+v", got)
	}
	if got, _ := st.ListAccess(ctx, AccessQuery{Sandboxes: []string{"id-box", "nope"}}); len(got) != 3 {
		t.Fatalf("sandbox filter: %+v", got)
	}
}

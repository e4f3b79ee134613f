package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestTenancyIdentity drives workspaces, users and keys through the real
// daemon: the instance admin makes workspace w2 and its admin, w2's admin
// makes a member; each sees who it is; w2 cannot see the default
// workspace's sandbox; revoked and expired keys fail at once; and keys,
// users and the access audit survive a kill -9 — an audit that holds
// records of what was done and no key anywhere.
func TestTenancyIdentity(t *testing.T) {
	d := startDaemon(t, "namespace", "")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root := d.Client
	sn := readySnapshot(t, root, "tenancy", testImage(t))
	sb := newSandbox(t, root, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "private-box" })
	mustRun(t, root, sb.Name, "echo hi")

	w2, err := root.CreateWorkspace(ctx, "w2")
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{testKey}
	newClient := func(c *cubicle.Client, req protocol.CreateKeyRequest) (*cubicle.Client, *protocol.Key) {
		t.Helper()
		k, err := c.CreateKey(ctx, req)
		if err != nil {
			t.Fatalf("create key %+v: %v", req, err)
		}
		keys = append(keys, k.Key)
		return cubicle.New(d.Endpoint, k.Key), k
	}
	wanda, err := root.CreateUser(ctx, protocol.CreateUserRequest{Name: "Wanda", WorkspaceID: w2.ID})
	if err != nil {
		t.Fatal(err)
	}
	w2Admin, w2AdminKey := newClient(root, protocol.CreateKeyRequest{Name: "w2 admin", UserID: wanda.ID, Role: "admin", WorkspaceID: w2.ID})
	mo, err := w2Admin.CreateUser(ctx, protocol.CreateUserRequest{Name: "Mo"})
	if err != nil {
		t.Fatal(err)
	}
	member, _ := newClient(w2Admin, protocol.CreateKeyRequest{UserID: mo.ID, Role: "member"})

	for _, c := range []struct {
		name          string
		c             *cubicle.Client
		user, ws      string
		role          string
		instanceAdmin bool
	}{
		{"instance admin", root, "admin", "default", "admin", true},
		{"w2 admin", w2Admin, wanda.ID, w2.ID, "admin", false},
		{"w2 member", member, mo.ID, w2.ID, "member", false},
	} {
		me, err := c.c.WhoAmI(ctx)
		if err != nil || me.User.ID != c.user || me.Workspace.ID != c.ws || me.Role != c.role || me.InstanceAdmin != c.instanceAdmin {
			t.Errorf("whoami of the %s: %+v %v", c.name, me, err)
		}
	}
	if _, err := w2Admin.CreateWorkspace(ctx, "w3"); !cubicle.IsForbidden(err) {
		t.Errorf("w2's admin creates a workspace: %v", err)
	}
	if _, err := member.CreateKey(ctx, protocol.CreateKeyRequest{Role: "admin"}); !cubicle.IsForbidden(err) {
		t.Errorf("a member mints an admin key: %v", err)
	}

	// Nothing crosses a workspace, by name or on the dataplane by id.
	if _, err := w2Admin.GetSandbox(ctx, sb.Name); !cubicle.IsNotFound(err) {
		t.Errorf("w2's admin gets the default workspace's sandbox: %v", err)
	}
	req, _ := http.NewRequest("POST", d.Endpoint+"/dp/"+sb.ID+"/execute", strings.NewReader(`{"command":"id"}`))
	req.Header.Set("X-Api-Key", w2AdminKey.Key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 404 {
		t.Errorf("w2's admin execs in the default workspace's sandbox: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := root.DeleteWorkspace(ctx, "default"); !cubicle.IsConflict(err) {
		t.Errorf("delete the default workspace, which has sandboxes: %v", err)
	}

	// Revocation takes effect at once; expiry when it comes.
	doomed, doomedKey := newClient(w2Admin, protocol.CreateKeyRequest{Role: "member", UserID: mo.ID})
	if _, err := doomed.WhoAmI(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w2Admin.RevokeKey(ctx, "", doomedKey.ID); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	if _, err := doomed.WhoAmI(ctx); !cubicle.IsUnauthorized(err) {
		t.Errorf("revoked key: %v", err)
	}
	if took := time.Since(revokedAt); took > time.Second {
		t.Errorf("revocation took %v to take effect", took)
	}
	one := int64(1)
	short, _ := newClient(w2Admin, protocol.CreateKeyRequest{Role: "member", ExpiresInSeconds: &one})
	if _, err := short.WhoAmI(ctx); err != nil {
		t.Fatalf("key before its expiry: %v", err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := short.WhoAmI(ctx); !cubicle.IsUnauthorized(err) {
		t.Errorf("expired key: %v", err)
	}

	// Records are flushed within the audit's flush interval (100 ms);
	// only what is younger than that is lost to a kill -9.
	time.Sleep(300 * time.Millisecond)
	d.kill9()
	d.restart()
	if me, err := w2Admin.WhoAmI(ctx); err != nil || me.User.Name != "Wanda" {
		t.Fatalf("w2's admin after a kill -9: %+v %v", me, err)
	}
	if _, err := doomed.WhoAmI(ctx); !cubicle.IsUnauthorized(err) {
		t.Errorf("revoked key after a kill -9: %v", err)
	}
	users, err := w2Admin.ListUsers(ctx, "")
	if err != nil || len(users) != 2 {
		t.Errorf("w2's users after a kill -9: %v %v", users, err)
	}
	// A graceful stop flushes what is buffered.
	if _, err := member.GetSandbox(ctx, "after-restart"); !cubicle.IsNotFound(err) {
		t.Fatal(err)
	}
	d.stop()
	d.restart()

	var all []protocol.AccessRecord
	q := cubicle.AccessQuery{WorkspaceID: "*", Limit: 500}
	for {
		page, err := root.AccessLog(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Items...)
		if page.NextCursor == nil {
			break
		}
		q.Cursor = *page.NextCursor
	}
	raw, _ := json.Marshal(all)
	for _, k := range keys {
		if strings.Contains(string(raw), k) {
			t.Fatalf("the access audit holds key %s…", k[:12])
		}
	}
	has := func(what string, match func(r protocol.AccessRecord) bool) {
		t.Helper()
		for _, r := range all {
			if match(r) {
				return
			}
		}
		t.Errorf("no access record of %s among %d", what, len(all))
	}
	has("the exec in private-box", func(r protocol.AccessRecord) bool {
		return r.Sandbox == sb.ID && r.Route == "GET /dp/{id}/execute/ws" && r.WorkspaceID == "default"
	})
	has("w2's admin's probe of private-box", func(r protocol.AccessRecord) bool {
		return r.Sandbox == sb.Name && r.Status == 404 && r.WorkspaceID == w2.ID && r.KeyPrefix == w2AdminKey.Prefix
	})
	has("w2's admin's dataplane probe", func(r protocol.AccessRecord) bool { return r.Sandbox == sb.ID && r.Status == 404 })
	has("the creation of w2's admin key", func(r protocol.AccessRecord) bool {
		return r.Action == "key.create" && r.Resource == w2AdminKey.ID && r.WorkspaceID == w2.ID
	})
	has("the revocation", func(r protocol.AccessRecord) bool { return r.Action == "key.revoke" && r.Resource == doomedKey.ID })
	has("the revoked key's 401", func(r protocol.AccessRecord) bool {
		return r.Status == 401 && r.KeyPrefix == doomedKey.Prefix && r.WorkspaceID == w2.ID
	})
	has("the member's 403", func(r protocol.AccessRecord) bool {
		return r.Status == 403 && r.Route == "POST /v2/sandboxes/keys" && r.UserID == mo.ID
	})
	has("the request just before the graceful stop", func(r protocol.AccessRecord) bool { return r.Sandbox == "after-restart" })

	// w2's admin reads only w2's records.
	page, err := w2Admin.AccessLog(ctx, cubicle.AccessQuery{Limit: 500})
	if err != nil || len(page.Items) == 0 {
		t.Fatalf("w2's access log: %v %v", page, err)
	}
	for _, r := range page.Items {
		if r.WorkspaceID != w2.ID {
			t.Fatalf("w2's admin reads a record of workspace %q", r.WorkspaceID)
		}
	}
	if _, err := member.AccessLog(ctx, cubicle.AccessQuery{}); !cubicle.IsForbidden(err) {
		t.Errorf("a member reads the access log: %v", err)
	}
}

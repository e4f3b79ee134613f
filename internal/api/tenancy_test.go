package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accesslog"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/identity"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// syncAudit writes each record at once, so tests read it back without
// waiting for accesslog's flush.
type syncAudit struct{ st store.Store }

func (a syncAudit) Record(ctx context.Context, rec store.AccessRecord) {
	accesslog.Fill(ctx, &rec)
	if err := a.st.AppendAccess(ctx, []store.AccessRecord{rec}); err != nil {
		panic(err)
	}
}

// tenancyAPI is a Server whose identity side is real (SQLite store,
// authenticator, identity service) over the fake sandbox manager: the
// rules live in the service and its store, and are tested through the
// routes.
type tenancyAPI struct {
	*testAPI
	st *store.SQLite
	// root is the bootstrap (instance admin) key.
	root string
}

func newTenancyAPI(t *testing.T, opts ...Option) *tenancyAPI {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	root, err := auth.Bootstrap(ctx, st, "")
	if err != nil {
		t.Fatal(err)
	}
	authn := auth.New(st)
	audit := syncAudit{st}
	ta := &testAPI{mgr: newFakeSandboxes(), images: &fakeImages{}}
	ta.srv = New(ta.mgr, authn, ta.images, "http://api.test", slog.New(slog.DiscardHandler),
		append(opts, WithIdentity(identity.New(st, authn, audit)), WithAccessLog(audit))...)
	return &tenancyAPI{testAPI: ta, st: st, root: root}
}

const v2 = "/v2/sandboxes"

// ok sends a request and fails unless it answers want; it returns the
// body as an object.
func (ta *tenancyAPI) ok(t *testing.T, want int, method, path, key string, body any) map[string]any {
	t.Helper()
	st, out := ta.do(t, method, v2+path, key, body)
	if st != want {
		t.Fatalf("%s %s: %d %v, want %d", method, path, st, out, want)
	}
	m, _ := out.(map[string]any)
	return m
}

// wantField checks a 422 naming field.
func (ta *tenancyAPI) wantField(t *testing.T, field, method, path, key string, body any) {
	t.Helper()
	st, out := ta.do(t, method, v2+path, key, body)
	if loc, _ := validation(out); st != 422 || loc != "body/"+field {
		t.Errorf("%s %s %v: %d %v, want a 422 naming %s", method, path, body, st, out, field)
	}
}

// newKey makes a key with key and returns its secret and id.
func (ta *tenancyAPI) newKey(t *testing.T, key string, req protocol.CreateKeyRequest) (secret, id string) {
	t.Helper()
	k := ta.ok(t, 201, "POST", "/keys", key, req)
	secret, _ = k["key"].(string)
	id, _ = k["id"].(string)
	if !strings.HasPrefix(secret, "cbk_") || k["prefix"] != secret[:store.KeyPrefixLen] {
		t.Fatalf("new key %v: want a cbk_ key and its prefix", k)
	}
	return secret, id
}

// tenants is two workspaces' worth of keys: the default workspace's
// (non-instance) admin, and w2's admin and member.
type tenants struct {
	defAdmin, w2, w2Admin, w2Member, w2MemberKeyID, memberUser, adminUser string
}

func (ta *tenancyAPI) tenants(t *testing.T) tenants {
	var tn tenants
	dana := ta.ok(t, 201, "POST", "/users", ta.root, map[string]any{"name": "Dana"})
	tn.defAdmin, _ = ta.newKey(t, ta.root, protocol.CreateKeyRequest{UserID: dana["id"].(string), Role: "admin"})
	tn.w2 = ta.ok(t, 201, "POST", "/workspaces", ta.root, map[string]any{"name": "w2"})["id"].(string)
	wanda := ta.ok(t, 201, "POST", "/users", ta.root, map[string]any{"name": "Wanda", "workspace_id": tn.w2})
	tn.adminUser = wanda["id"].(string)
	tn.w2Admin, _ = ta.newKey(t, ta.root, protocol.CreateKeyRequest{Name: "w2 admin", UserID: tn.adminUser, Role: "admin", WorkspaceID: tn.w2})
	mo := ta.ok(t, 201, "POST", "/users", tn.w2Admin, map[string]any{"name": "Mo", "email": "mo@example.com"})
	tn.memberUser = mo["id"].(string)
	if mo["workspace_id"] != tn.w2 || mo["email"] != "mo@example.com" {
		t.Fatalf("user made by w2's admin: %v", mo)
	}
	secs := int64(3600)
	tn.w2Member, tn.w2MemberKeyID = ta.newKey(t, tn.w2Admin, protocol.CreateKeyRequest{UserID: tn.memberUser, Role: "member", ExpiresInSeconds: &secs})
	return tn
}

func TestWorkspaceRoutes(t *testing.T) {
	ta := newTenancyAPI(t)
	tn := ta.tenants(t)
	ta.ok(t, 403, "POST", "/workspaces", tn.defAdmin, map[string]any{"name": "w3"})
	ta.ok(t, 409, "POST", "/workspaces", ta.root, map[string]any{"name": "w2"})
	ta.wantField(t, "name", "POST", "/workspaces", ta.root, map[string]any{"name": "bad name"})
	if ws := ta.ok(t, 200, "GET", "/workspaces", ta.root, nil)["workspaces"].([]any); len(ws) != 2 {
		t.Errorf("instance admin lists %d workspaces, want 2", len(ws))
	}
	ws := ta.ok(t, 200, "GET", "/workspaces", tn.w2Admin, nil)["workspaces"].([]any)
	if len(ws) != 1 || ws[0].(map[string]any)["id"] != tn.w2 {
		t.Errorf("w2's admin lists %v, want only w2", ws)
	}
	ta.ok(t, 404, "GET", "/workspaces/default", tn.w2Admin, nil)
	if w := ta.ok(t, 200, "GET", "/workspaces/w2", ta.root, nil); w["id"] != tn.w2 || w["created_at"] == nil {
		t.Errorf("workspace by name: %v", w)
	}
	ta.ok(t, 403, "DELETE", "/workspaces/"+tn.w2, tn.w2Admin, nil)
	ta.ok(t, 409, "DELETE", "/workspaces/default", ta.root, nil)
	now := time.Now()
	if err := ta.st.CreateSandbox(context.Background(), &store.Sandbox{ID: "b1", WorkspaceID: tn.w2, Name: "b", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	ta.ok(t, 409, "DELETE", "/workspaces/"+tn.w2, ta.root, nil)
	if err := ta.st.DeleteSandbox(context.Background(), "b1"); err != nil {
		t.Fatal(err)
	}
	ta.ok(t, 204, "DELETE", "/workspaces/"+tn.w2, ta.root, nil)
	ta.ok(t, 401, "GET", "/whoami", tn.w2Admin, nil)
	ta.ok(t, 404, "GET", "/workspaces/"+tn.w2, ta.root, nil)
}

func TestUserRoutes(t *testing.T) {
	ta := newTenancyAPI(t)
	tn := ta.tenants(t)
	ta.ok(t, 403, "POST", "/users", tn.w2Member, map[string]any{"name": "x"})
	ta.ok(t, 403, "POST", "/users", tn.w2Admin, map[string]any{"name": "x", "workspace_id": "default"})
	ta.wantField(t, "name", "POST", "/users", tn.w2Admin, map[string]any{"name": ""})
	ta.wantField(t, "email", "POST", "/users", tn.w2Admin, map[string]any{"name": "x", "email": "nope"})
	ta.wantField(t, "workspace_id", "POST", "/users", ta.root, map[string]any{"name": "x", "workspace_id": "nope"})
	ta.wantField(t, "nick", "POST", "/users", tn.w2Admin, map[string]any{"name": "x", "nick": "y"})
	// Members list their workspace's users (whom they can share with).
	if us := ta.ok(t, 200, "GET", "/users", tn.w2Member, nil)["users"].([]any); len(us) != 2 {
		t.Errorf("member lists %v, want w2's two users", us)
	}
	if us := ta.ok(t, 200, "GET", "/users?workspace_id="+tn.w2, ta.root, nil)["users"].([]any); len(us) != 2 {
		t.Errorf("instance admin lists w2's users: %v", us)
	}
	ta.ok(t, 200, "GET", "/users/"+tn.memberUser, tn.w2Admin, nil)
	ta.ok(t, 404, "GET", "/users/"+tn.memberUser, tn.defAdmin, nil)
	ta.ok(t, 404, "GET", "/users/admin", tn.w2Admin, nil)
	ta.ok(t, 403, "DELETE", "/users/"+tn.adminUser, tn.w2Member, nil)
	ta.ok(t, 409, "DELETE", "/users/admin", ta.root, nil)
	ta.ok(t, 204, "DELETE", "/users/"+tn.memberUser, tn.w2Admin, nil)
	ta.ok(t, 401, "GET", "/whoami", tn.w2Member, nil) // the user's keys went with it
	ta.ok(t, 404, "DELETE", "/users/"+tn.memberUser, tn.w2Admin, nil)
}

func TestKeyRoutes(t *testing.T) {
	ta := newTenancyAPI(t)
	tn := ta.tenants(t)
	for field, body := range map[string]map[string]any{
		"role":               {"role": "owner"},
		"expires_in_seconds": {"role": "member", "expires_in_seconds": 0},
		"user_id":            {"role": "member", "user_id": "nobody"},
		"name":               {"role": "member", "name": strings.Repeat("n", 129)},
	} {
		ta.wantField(t, field, "POST", "/keys", tn.w2Admin, body)
	}
	ta.wantField(t, "expires_in_seconds", "POST", "/keys", tn.w2Admin, map[string]any{"role": "member", "expires_in_seconds": "soon"})
	ta.wantField(t, "user_id", "POST", "/keys", ta.root, map[string]any{"role": "member", "workspace_id": tn.w2})
	ta.wantField(t, "workspace_id", "POST", "/keys", ta.root, map[string]any{"role": "member", "workspace_id": "nope", "user_id": "x"})
	ta.ok(t, 403, "POST", "/keys", tn.w2Admin, map[string]any{"role": "admin", "workspace_id": "default", "user_id": "admin"})
	ta.ok(t, 403, "POST", "/keys", tn.w2Member, map[string]any{"role": "admin"})
	ta.ok(t, 403, "POST", "/keys", tn.w2Member, map[string]any{"role": "member", "user_id": tn.adminUser})
	own, ownID := ta.newKey(t, tn.w2Member, protocol.CreateKeyRequest{Name: "laptop", Role: "member"})

	keys := ta.ok(t, 200, "GET", "/keys", tn.w2Member, nil)["keys"].([]any)
	if len(keys) != 2 {
		t.Fatalf("member lists %d keys, want its own 2", len(keys))
	}
	if ks := ta.ok(t, 200, "GET", "/keys", tn.w2Admin, nil)["keys"].([]any); len(ks) != 3 {
		t.Fatalf("admin lists %d keys, want w2's 3", len(ks))
	}
	raw, _ := json.Marshal(keys)
	if strings.Contains(string(raw), tn.w2Member) || strings.Contains(string(raw), own) || strings.Contains(string(raw), auth.Hash(own)) {
		t.Fatalf("key list reveals a secret or hash: %s", raw)
	}
	exp, _ := keys[0].(map[string]any)["expires_at"].(string)
	if at, err := time.Parse(time.RFC3339, exp); err != nil || time.Until(at) < 59*time.Minute {
		t.Errorf("expires_at %q of a one-hour key", exp)
	}

	me := ta.ok(t, 200, "GET", "/whoami", tn.w2Member, nil)
	if me["role"] != "member" || me["key_prefix"] != tn.w2Member[:12] || me["instance_admin"] != false ||
		me["user"].(map[string]any)["name"] != "Mo" || me["workspace"].(map[string]any)["name"] != "w2" {
		t.Errorf("whoami of w2's member: %v", me)
	}
	if me := ta.ok(t, 200, "GET", "/whoami", ta.root, nil); me["instance_admin"] != true || me["role"] != "admin" {
		t.Errorf("whoami of the instance admin: %v", me)
	}

	ta.ok(t, 404, "DELETE", "/keys/"+ownID, tn.defAdmin, nil)
	// A member's keys are its own: another's is not found.
	_, adminKeyID := ta.newKey(t, tn.w2Admin, protocol.CreateKeyRequest{Role: "admin"})
	ta.ok(t, 404, "DELETE", "/keys/"+adminKeyID, tn.w2Member, nil)
	ta.ok(t, 204, "DELETE", "/keys/"+ownID, tn.w2Member, nil)
	ta.ok(t, 401, "GET", "/whoami", own, nil)
	ta.ok(t, 204, "DELETE", "/keys/"+tn.w2MemberKeyID, tn.w2Admin, nil)
	ta.ok(t, 401, "GET", "/whoami", tn.w2Member, nil)
	rootKeys := ta.ok(t, 200, "GET", "/keys", ta.root, nil)["keys"].([]any)
	ta.ok(t, 409, "DELETE", "/keys/"+rootKeys[0].(map[string]any)["id"].(string), ta.root, nil)
}

func TestAccessAudit(t *testing.T) {
	ta := newTenancyAPI(t)
	tn := ta.tenants(t)
	ta.ok(t, 404, "GET", "/boxes/x?secret-query=hunter2", tn.w2Admin, nil)
	ta.ok(t, 403, "GET", "/audit/access", tn.w2Member, nil)
	ta.ok(t, 204, "DELETE", "/keys/"+tn.w2MemberKeyID, tn.w2Admin, nil)
	ta.ok(t, 401, "GET", "/boxes", tn.w2Member, nil)
	ta.ok(t, 401, "GET", "/images", "cbk_"+strings.Repeat("0", 64), nil)
	ta.ok(t, 403, "POST", "/users", tn.w2Admin, map[string]any{"name": "x", "workspace_id": "default"})
	ta.wantField(t, "since", "GET", "/audit/access?since=yesterday", tn.w2Admin, nil)
	ta.wantField(t, "cursor", "GET", "/audit/access?cursor=x", tn.w2Admin, nil)

	items := ta.ok(t, 200, "GET", "/audit/access?limit=500", tn.w2Admin, nil)["items"].([]any)
	raw, _ := json.Marshal(items)
	for _, k := range []string{ta.root, tn.defAdmin, tn.w2Admin, tn.w2Member, "hunter2"} {
		if strings.Contains(string(raw), k) {
			t.Fatalf("access audit holds a key or query value %q: %s", k, raw)
		}
	}
	has := func(what string, match func(map[string]any) bool) {
		t.Helper()
		for _, it := range items {
			if match(it.(map[string]any)) {
				return
			}
		}
		t.Errorf("no record of %s in %s", what, raw)
	}
	has("key.create by the instance admin, in w2", func(r map[string]any) bool {
		return r["action"] == "key.create" && r["workspace_id"] == tn.w2 && r["user_id"] == auth.BootstrapUser
	})
	has("user.create", func(r map[string]any) bool { return r["action"] == "user.create" && r["resource"] == tn.memberUser })
	has("key.revoke", func(r map[string]any) bool { return r["action"] == "key.revoke" && r["resource"] == tn.w2MemberKeyID })
	has("the sandbox read", func(r map[string]any) bool {
		return r["resource_kind"] == "sandbox" && r["sandbox"] == "x" && r["status"] == 404.0 && r["route"] == "GET /v2/sandboxes/boxes/{name}" &&
			r["key_prefix"] == tn.w2Admin[:12] && r["request_id"] != ""
	})
	has("the revoked key's 401, attributed", func(r map[string]any) bool {
		return r["status"] == 401.0 && r["user_id"] == tn.memberUser && r["key_prefix"] == tn.w2Member[:12]
	})
	has("the member's 403", func(r map[string]any) bool {
		return r["status"] == 403.0 && r["route"] == "GET /v2/sandboxes/audit/access" && r["user_id"] == tn.memberUser
	})
	has("the admin's 403 on another workspace", func(r map[string]any) bool {
		return r["status"] == 403.0 && r["resource_kind"] == "user" && r["method"] == "POST"
	})
	for _, it := range items {
		if r := it.(map[string]any); r["workspace_id"] != tn.w2 {
			t.Errorf("w2's admin reads a record of workspace %v", r["workspace_id"])
		}
	}

	// An unknown key's 401 belongs to no workspace: the instance admin
	// reads it across workspaces.
	all := ta.ok(t, 200, "GET", "/audit/access?workspace_id=*&limit=500", ta.root, nil)["items"].([]any)
	found := false
	for _, it := range all {
		r := it.(map[string]any)
		found = found || r["status"] == 401.0 && r["workspace_id"] == "" && r["key_prefix"] == "cbk_00000000"
	}
	if !found {
		t.Error("instance admin does not see the unknown key's 401")
	}
	ta.ok(t, 403, "GET", "/audit/access?workspace_id=*", tn.w2Admin, nil)

	// Paging: pages of 2 follow one another to the end, with nothing
	// repeated or skipped.
	items = ta.ok(t, 200, "GET", "/audit/access?limit=500", tn.w2Admin, nil)["items"].([]any)
	var seqs []float64
	cursor := ""
	for range 100 {
		page := ta.ok(t, 200, "GET", "/audit/access?limit=2"+cursor, tn.w2Admin, nil)
		for _, it := range page["items"].([]any) {
			seqs = append(seqs, it.(map[string]any)["seq"].(float64))
		}
		next, _ := page["next_cursor"].(string)
		if next == "" {
			break
		}
		cursor = "&cursor=" + next
	}
	if len(seqs) != len(items) {
		t.Fatalf("paged %d records, want %d", len(seqs), len(items))
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("pages out of order: %v", seqs)
		}
	}
	if f := ta.ok(t, 200, "GET", "/audit/access?sandbox=x&user="+tn.adminUser, tn.w2Admin, nil)["items"].([]any); len(f) != 1 {
		t.Errorf("filter by sandbox and user: %v", f)
	}
	since := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if f := ta.ok(t, 200, "GET", "/audit/access?since="+since, tn.w2Admin, nil)["items"].([]any); len(f) != 0 {
		t.Errorf("since an hour from now: %v", f)
	}
}

// TestAccessAuditUnauthenticatedRoutes: a refused download link (a route
// with its own credential, not an API key) is recorded by pattern, never
// with its token; a request the audit does not keep is not.
func TestAccessAuditUnauthenticatedRoutes(t *testing.T) {
	ta := newTenancyAPI(t, func(s *Server) { s.gw = &fakeGateway{} })
	if st, _ := ta.do(t, "GET", "/d/not-a-valid-token", "", nil); st != 401 {
		t.Fatalf("bad download link: %d", st)
	}
	ta.ok(t, 200, "GET", "/images", ta.root, nil)
	recs, err := ta.st.ListAccess(context.Background(), store.AccessQuery{})
	if err != nil || len(recs) != 1 {
		t.Fatalf("records %+v %v, want only the refused link", recs, err)
	}
	if r := recs[0]; r.Route != "GET /d/{token}" || r.Status != 401 || r.RequestID == "" || strings.Contains(fmt.Sprint(r), "not-a-valid-token") {
		t.Errorf("record of the refused link: %+v", r)
	}
}

// TestAccessTargets: which resource a route pattern names.
func TestAccessTargets(t *testing.T) {
	for pattern, want := range map[string]accessTarget{
		"GET /v2/sandboxes/boxes/{name}":                         {"sandbox", "name", "name"},
		"DELETE /v2/sandboxes/boxes/{name}/shares/{id}":          {"share", "id", "name"},
		"POST /dp/{id}/execute":                                  {"sandbox", "id", "id"},
		"GET /v2/sandboxes/boxes":                                {"sandbox", "", ""},
		"PUT /v2/sandboxes/secrets/{name}":                       {"secret", "name", ""},
		"GET /api/v2/sandboxes/workspaces/{id}/quotas":           {"workspace", "id", ""},
		"GET /v2/sandboxes/images":                               {},
		"DELETE /v2/sandboxes/images/{ref...}":                   {},
		"GET /v2/sandboxes/snapshots/{id}":                       {"snapshot", "id", ""},
		fmt.Sprintf("GET %s/registries/{name}", "/v2/sandboxes"): {"registry", "name", ""},
	} {
		if got := targetOf(pattern); got != want {
			t.Errorf("targetOf(%q) = %+v, want %+v", pattern, got, want)
		}
	}
}

package cubicle

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestTenancyCalls checks each tenancy call's method, path, query and
// body against the double, and that answers decode.
func TestTenancyCalls(t *testing.T) {
	d := newFakeDaemon(t)
	type seen struct{ method, path, query, body string }
	var got []seen
	now := time.Date(2026, 5, 1, 2, 3, 4, 0, time.UTC)
	answers := map[string]any{
		"POST /v2/sandboxes/workspaces":        protocol.Workspace{ID: "w2", Name: "team", CreatedAt: now},
		"GET /v2/sandboxes/workspaces":         protocol.WorkspaceList{Workspaces: []protocol.Workspace{{ID: "w2"}}},
		"GET /v2/sandboxes/workspaces/{id}":    protocol.Workspace{ID: "w2"},
		"DELETE /v2/sandboxes/workspaces/{id}": nil,
		"POST /v2/sandboxes/users":             protocol.User{ID: "u1", Name: "Mo"},
		"GET /v2/sandboxes/users":              protocol.UserList{Users: []protocol.User{{ID: "u1"}, {ID: "u2"}}},
		"GET /v2/sandboxes/users/{id}":         protocol.User{ID: "u1"},
		"DELETE /v2/sandboxes/users/{id}":      nil,
		"POST /v2/sandboxes/keys":              protocol.Key{ID: "k1", Key: "cbk_secret", Prefix: "cbk_secr"},
		"GET /v2/sandboxes/keys":               protocol.KeyList{Keys: []protocol.Key{{ID: "k1"}}},
		"DELETE /v2/sandboxes/keys/{id}":       nil,
		"GET /v2/sandboxes/whoami":             protocol.WhoAmI{Role: "admin", KeyPrefix: "cbk_12345678", Workspace: protocol.WorkspaceRef{ID: "w2"}},
		"GET /v2/sandboxes/audit/access":       protocol.AccessList{Items: []protocol.AccessRecord{{Seq: 7}}, NextCursor: new("7")},
	}
	for pattern, answer := range answers {
		d.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got = append(got, seen{r.Method, r.URL.Path, r.URL.RawQuery, string(b)})
			if answer == nil {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			writeJSON(w, http.StatusOK, answer)
		})
	}
	c := d.client()
	ctx := t.Context()
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ws, err := c.CreateWorkspace(ctx, "team")
	check(err)
	if ws.ID != "w2" || !ws.CreatedAt.Equal(now) {
		t.Errorf("workspace %+v", ws)
	}
	list, err := c.ListWorkspaces(ctx)
	check(err)
	_, err = c.GetWorkspace(ctx, "team")
	check(err)
	check(c.DeleteWorkspace(ctx, "w2"))
	_, err = c.CreateUser(ctx, protocol.CreateUserRequest{Name: "Mo", WorkspaceID: "w2"})
	check(err)
	users, err := c.ListUsers(ctx, "w2")
	check(err)
	_, err = c.GetUser(ctx, "", "u1")
	check(err)
	check(c.DeleteUser(ctx, "w2", "u1"))
	secs := int64(60)
	k, err := c.CreateKey(ctx, protocol.CreateKeyRequest{Role: "member", UserID: "u1", ExpiresInSeconds: &secs})
	check(err)
	keys, err := c.ListKeys(ctx, "")
	check(err)
	check(c.RevokeKey(ctx, "w2", "k1"))
	me, err := c.WhoAmI(ctx)
	check(err)
	page, err := c.AccessLog(ctx, AccessQuery{Sandbox: "box", Cursor: "3", Limit: 2, Since: now})
	check(err)
	if len(list) != 1 || len(users) != 2 || k.Key != "cbk_secret" || len(keys) != 1 || me.KeyPrefix != "cbk_12345678" ||
		me.Workspace.ID != "w2" || len(page.Items) != 1 || page.Items[0].Seq != 7 || *page.NextCursor != "7" {
		t.Errorf("answers: %v %v %+v %v %+v %+v", list, users, k, keys, me, page)
	}

	want := []seen{
		{"POST", "/v2/sandboxes/workspaces", "", `{"name":"team"}`},
		{"GET", "/v2/sandboxes/workspaces", "", ""},
		{"GET", "/v2/sandboxes/workspaces/team", "", ""},
		{"DELETE", "/v2/sandboxes/workspaces/w2", "", ""},
		{"POST", "/v2/sandboxes/users", "", `{"name":"Mo","workspace_id":"w2"}`},
		{"GET", "/v2/sandboxes/users", "workspace_id=w2", ""},
		{"GET", "/v2/sandboxes/users/u1", "", ""},
		{"DELETE", "/v2/sandboxes/users/u1", "workspace_id=w2", ""},
		{"POST", "/v2/sandboxes/keys", "", `{"user_id":"u1","role":"member","expires_in_seconds":60}`},
		{"GET", "/v2/sandboxes/keys", "", ""},
		{"DELETE", "/v2/sandboxes/keys/k1", "workspace_id=w2", ""},
		{"GET", "/v2/sandboxes/whoami", "", ""},
		{"GET", "/v2/sandboxes/audit/access", "cursor=3&limit=2&sandbox=box&since=2026-05-01T02%3A03%3A04Z", ""},
	}
	if len(got) != len(want) {
		t.Fatalf("requests %+v", got)
	}
	for i := range want {
		w, g := want[i], got[i]
		if w.body != "" {
			var a, b any
			json.Unmarshal([]byte(w.body), &a)
			json.Unmarshal([]byte(g.body), &b)
			wj, _ := json.Marshal(a)
			gj, _ := json.Marshal(b)
			w.body, g.body = string(wj), string(gj)
		}
		if g != w {
			t.Errorf("request %d: %+v, want %+v", i, g, w)
		}
	}
}

func TestTenancyErrors(t *testing.T) {
	d := newFakeDaemon(t)
	d.mux.HandleFunc("POST /v2/sandboxes/workspaces", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusForbidden, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "Forbidden", Message: "instance admin only"}})
	})
	c := d.client()
	if _, err := c.CreateWorkspace(t.Context(), "x"); !IsForbidden(err) || IsUnauthorized(err) {
		t.Errorf("403: %v", err)
	}
	bad := New(d.srv.URL, "wrong")
	if _, err := bad.WhoAmI(t.Context()); !IsUnauthorized(err) || IsForbidden(err) {
		t.Errorf("401: %v", err)
	}
}

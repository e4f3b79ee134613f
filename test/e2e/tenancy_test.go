package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// addKey adds an API key for user with role in workspace ws (created if
// needed) straight into the running daemon's database, and returns it.
func addKey(t testing.TB, d *daemon, ws, user, role string) string {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(d.dataDir, "cubicle.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.EnsureWorkspace(ctx, store.Workspace{ID: ws, Name: ws, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	key := auth.NewKey()
	if err := st.PutAPIKey(ctx, store.APIKey{ID: uuid.NewString(), WorkspaceID: ws, User: user, Role: role,
		Hash: auth.Hash(key), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return key
}

// raw sends method path (absolute on the daemon) with key and body (a
// string is sent as is, anything else as JSON), without following
// redirects, and returns the status and body.
func raw(t testing.TB, d *daemon, key, method, path string, body any) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, d.Endpoint+path, requestBody(body))
	req.Header.Set("X-Api-Key", key)
	req.Header.Set("Content-Type", "application/json")
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// level is a principal's access to the battery's sandbox (internal/authz).
type level int

const (
	none level = iota
	read
	use
	owner
)

// route is one request of the battery, needing level need. body may use
// {n} (the sandbox name), {id} (its id) and {u} (a fresh name).
type route struct {
	method, path string
	body         any
	need         level
	// destructive routes are only tried with keys that are refused.
	destructive bool
	// okCode, when set, is the success answer (else any 2xx or 3xx).
	okCode int
}

// batteryRoutes are every control-plane, dataplane and gateway route that
// names a sandbox, in an order that leaves the sandbox running.
var batteryRoutes = []route{
	{"GET", "/v2/sandboxes/boxes/{n}", nil, read, false, 0},
	{"GET", "/v2/sandboxes/boxes/{n}/status", nil, read, false, 0},
	{"GET", "/v2/sandboxes/boxes/{n}/egress-log", nil, read, false, 0},
	{"GET", "/v2/sandboxes/diff?a={n}&b={n}", nil, read, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/service-url", map[string]any{"port": 8001}, read, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/download-url", map[string]any{"path": "/etc/hostname"}, read, false, 0},
	{"GET", "/dp/{id}/download?path=/etc/passwd", nil, read, false, 0},
	{"POST", "/dp/{id}/glob", map[string]any{"pattern": "host*", "path": "/etc"}, read, false, 0},
	{"POST", "/dp/{id}/grep", map[string]any{"pattern": "root", "path": "/etc/passwd"}, read, false, 0},
	{"GET", "/s/login?sandbox={id}&port=8000", nil, read, false, 0},
	{"POST", "/dp/{id}/execute", map[string]any{"command": "true"}, use, false, 0},
	// Without upgrade headers an allowed request fails the upgrade (426);
	// refusals come before it.
	{"GET", "/dp/{id}/execute/ws", nil, use, false, http.StatusUpgradeRequired},
	{"POST", "/dp/{id}/upload?path=/tmp/up", "data", use, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/snapshot", map[string]any{"name": "{u}"}, use, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/fork", map[string]any{"count": 1, "names": []string{"{u}"}}, use, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/stop", nil, use, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/start", nil, use, false, 0},
	{"PATCH", "/v2/sandboxes/boxes/{n}", map[string]any{}, owner, false, 0},
	{"POST", "/v2/sandboxes/boxes/{n}/reset", map[string]any{}, owner, false, 0},
	{"GET", "/v2/sandboxes/boxes/{n}/shares", nil, owner, false, 0},
	{"DELETE", "/v2/sandboxes/boxes/{n}/shares/nope", nil, owner, true, 0},
	{"DELETE", "/v2/sandboxes/boxes/{n}", nil, owner, true, 0},
}

// TestTenancy is the tenancy battery: two workspaces with an admin and two
// members each. Every route naming a sandbox is tried with every key and
// answers exactly by the access level (404 with none — the same body as
// for a sandbox that does not exist —, 403 with too little, 2xx
// otherwise), before and after read, use and workspace-wide shares; lists
// page correctly through interleaved owners; a name clash does not name
// the owner; revoking a share cuts an open exec stream at once and kills
// its command.
func TestTenancy(t *testing.T) {
	ctx := context.Background()
	d := startDaemon(t, "namespace", "")
	sn := readySnapshot(t, d.Client, "base", testImage(t))
	keys := map[string]string{
		"admin1": testKey,
		"alice":  addKey(t, d, auth.DefaultWorkspace, "alice", store.RoleMember),
		"bob":    addKey(t, d, auth.DefaultWorkspace, "bob", store.RoleMember),
		"admin2": addKey(t, d, "w2", "w2-admin", store.RoleAdmin),
		"carol":  addKey(t, d, "w2", "carol", store.RoleMember),
		"dave":   addKey(t, d, "w2", "dave", store.RoleMember),
	}
	alice := cubicle.New(d.Endpoint, keys["alice"])
	bob := cubicle.New(d.Endpoint, keys["bob"])
	// Snapshots are private too until shared: a member neither gets nor
	// lists the admin's, nor boots from it.
	if _, err := bob.GetSnapshot(ctx, sn.ID); !cubicle.IsNotFound(err) {
		t.Fatalf("bob gets the admin's unshared snapshot: %v", err)
	}
	if l, err := bob.ListSnapshots(ctx, cubicle.ListOptions{}); err != nil || len(l.Snapshots) != 0 {
		t.Fatalf("bob lists %+v (%v), want none", l, err)
	}
	shareWithWorkspace(t, d.Client, sn.ID)
	box := newSandbox(t, alice, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "a-box" })
	// A login-mode grant on port 8000 for the gateway rows.
	if code, b := raw(t, d, keys["alice"], "POST", "/v2/sandboxes/boxes/a-box/service-url", map[string]any{"port": 8000, "access": "restricted"}); code != 200 {
		t.Fatalf("login grant: %d %s", code, b)
	}
	n := 0
	battery := func(t *testing.T, levels map[string]level) {
		t.Helper()
		for _, who := range slices.Sorted(func(yield func(string) bool) {
			for k := range levels {
				if !yield(k) {
					return
				}
			}
		}) {
			have := levels[who]
			for _, rt := range batteryRoutes {
				want := http.StatusNotFound
				switch {
				case have >= rt.need && rt.destructive:
					continue
				case have >= rt.need:
					want = 0 // any 2xx or 3xx
				case have > none:
					want = http.StatusForbidden
				}
				n++
				fill := strings.NewReplacer("{n}", box.Name, "{id}", box.ID, "{u}", fmt.Sprintf("t-%s-%d", who, n))
				path := fill.Replace(rt.path)
				var body any = rt.body
				if rt.body != nil {
					j, _ := json.Marshal(rt.body)
					body = fill.Replace(string(j))
				}
				code, b := raw(t, d, keys[who], rt.method, path, body)
				if want == 0 && rt.okCode != 0 {
					want = rt.okCode
				}
				if want == 0 && (code < 200 || code >= 400) || want != 0 && code != want {
					t.Errorf("%s %s as %s (%v): %d %s, want %d", rt.method, path, who, have, code, b, want)
				}
				if code == http.StatusNotFound && want == http.StatusNotFound {
					// The same answer as for a sandbox that does not exist.
					missing := strings.NewReplacer("{n}", "nosuch-box", "{id}", "0b5a3b6e-1111-4222-8333-444455556666", "{u}", "x").Replace(rt.path)
					mcode, mb := raw(t, d, keys[who], rt.method, missing, body)
					mb = strings.NewReplacer("nosuch-box", box.Name, "0b5a3b6e-1111-4222-8333-444455556666", box.ID).Replace(mb)
					if mcode != code || mb != b {
						t.Errorf("%s %s as %s: invisible answers %d %s, missing %d %s", rt.method, path, who, code, b, mcode, mb)
					}
				}
			}
		}
	}
	share := func(t *testing.T, body map[string]any) protocol.Share {
		t.Helper()
		code, b := raw(t, d, keys["alice"], "POST", "/v2/sandboxes/boxes/a-box/shares", body)
		var sh protocol.Share
		if code != 201 || json.Unmarshal([]byte(b), &sh) != nil {
			t.Fatalf("share %v: %d %s", body, code, b)
		}
		return sh
	}

	t.Run("private", func(t *testing.T) {
		battery(t, map[string]level{"admin1": owner, "alice": owner, "bob": none, "admin2": none, "carol": none, "dave": none})
	})
	var bobShare protocol.Share
	t.Run("read share", func(t *testing.T) {
		bobShare = share(t, map[string]any{"user_id": "bob", "access": "read"})
		battery(t, map[string]level{"bob": read, "carol": none})
	})
	t.Run("use share", func(t *testing.T) {
		if again := share(t, map[string]any{"user_id": "bob", "access": "use"}); again.ID != bobShare.ID {
			t.Fatalf("a second grant made share %s, want %s updated", again.ID, bobShare.ID)
		}
		battery(t, map[string]level{"bob": use, "admin2": none})
		if out := mustRun(t, bob, "a-box", "echo shared"); out != "shared\n" {
			t.Fatalf("exec with use: %q", out)
		}
	})
	t.Run("workspace share", func(t *testing.T) {
		if code, b := raw(t, d, keys["alice"], "DELETE", "/v2/sandboxes/boxes/a-box/shares/"+bobShare.ID, nil); code != 204 {
			t.Fatalf("revoke: %d %s", code, b)
		}
		battery(t, map[string]level{"bob": none})
		ws := share(t, map[string]any{"workspace": true, "access": "read"})
		if ws.Grantee != protocol.ShareGranteeWorkspace {
			t.Fatalf("workspace share: %+v", ws)
		}
		battery(t, map[string]level{"bob": read, "carol": none, "admin2": none})
		if code, b := raw(t, d, keys["alice"], "DELETE", "/v2/sandboxes/boxes/a-box/shares/"+ws.ID, nil); code != 204 {
			t.Fatalf("revoke workspace share: %d %s", code, b)
		}
	})
	t.Run("bad shares", func(t *testing.T) {
		for _, c := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"user_id": "bob", "access": "write"}, "access"},
			{map[string]any{"user_id": "carol", "access": "read"}, "user_id"}, // another workspace's user
			{map[string]any{"user_id": "nobody", "access": "read"}, "user_id"},
		} {
			code, b := raw(t, d, keys["alice"], "POST", "/v2/sandboxes/boxes/a-box/shares", c.body)
			if code != 422 || !strings.Contains(b, c.field) {
				t.Errorf("share %v: %d %s, want 422 naming %s", c.body, code, b, c.field)
			}
		}
	})
	t.Run("name clash", func(t *testing.T) {
		code, b := raw(t, d, keys["bob"], "POST", "/v2/sandboxes/boxes", map[string]any{"name": "a-box", "snapshot_id": sn.ID})
		if code != http.StatusConflict || strings.Contains(b, "alice") {
			t.Fatalf("create with a name bob cannot see: %d %s, want 409 not naming its owner", code, b)
		}
	})
	t.Run("paging", func(t *testing.T) {
		nowait := false
		for i := range 3 {
			for _, who := range []*cubicle.Client{alice, bob} {
				name := map[*cubicle.Client]string{alice: "pa", bob: "pb"}[who] + fmt.Sprint(i)
				if _, err := who.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: name, SnapshotID: sn.ID, WaitForReady: &nowait}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// One of alice's, shared with the workspace, is bob's to list too.
		if code, b := raw(t, d, keys["alice"], "POST", "/v2/sandboxes/boxes/pa1/shares", map[string]any{"workspace": true, "access": "read"}); code != 201 {
			t.Fatalf("share pa1: %d %s", code, b)
		}
		// bob's set, in list order: what he created (the battery's branches
		// too) and pa1, out of the admin's full list.
		all, err := d.Client.ListSandboxes(ctx, cubicle.ListOptions{Limit: 500})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, sb := range all.Sandboxes {
			if sb.CreatedBy == "bob" || sb.Name == "pa1" {
				want = append(want, sb.Name)
			}
		}
		if len(want) < 4 || len(all.Sandboxes) < len(want)+4 {
			t.Fatalf("the fixture is not interleaved: bob's %v of %d", want, len(all.Sandboxes))
		}
		var got []string
		for off, pages := 0, 0; ; pages++ {
			l, err := bob.ListSandboxes(ctx, cubicle.ListOptions{Limit: 2, Offset: off})
			if err != nil {
				t.Fatal(err)
			}
			for _, sb := range l.Sandboxes {
				got = append(got, sb.Name)
			}
			if l.NextCursor == nil || pages > 10 {
				break
			}
			if _, err := fmt.Sscan(*l.NextCursor, &off); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("bob's pages: %v, want %v", got, want)
		}
		l, err := cubicle.New(d.Endpoint, keys["carol"]).ListSandboxes(ctx, cubicle.ListOptions{})
		if err != nil || len(l.Sandboxes) != 0 {
			t.Fatalf("carol lists %v (%v)", l, err)
		}
	})
	t.Run("revocation cuts an open exec", func(t *testing.T) {
		sh := share(t, map[string]any{"user_id": "bob", "access": "use"})
		took, err := execUntilCut(t, bob, "a-box", "echo started; sleep 4; touch /tmp/survived; sleep 26", func() {
			if code, b := raw(t, d, keys["alice"], "DELETE", "/v2/sandboxes/boxes/a-box/shares/"+sh.ID, nil); code != 204 {
				t.Fatalf("revoke: %d %s", code, b)
			}
		})
		t.Logf("stream ended %v after the revocation: %v", took, err)
		if err == nil || !strings.Contains(err.Error(), "revoked") || took > 1500*time.Millisecond {
			t.Fatalf("stream ended after %v with %v, want a revoked error within ~1s", took, err)
		}
		time.Sleep(5 * time.Second)
		if out := mustRun(t, alice, "a-box", "ls /tmp/survived 2>/dev/null; true"); out != "" {
			t.Fatal("the cut command ran on")
		}
		if _, err := bob.GetSandbox(ctx, "a-box"); err == nil {
			t.Fatal("bob still sees a-box")
		}
	})
	t.Run("key revocation cuts an open exec", func(t *testing.T) {
		sh := share(t, map[string]any{"user_id": "bob", "access": "use"})
		defer raw(t, d, keys["alice"], "DELETE", "/v2/sandboxes/boxes/a-box/shares/"+sh.ID, nil)
		code, b := raw(t, d, keys["admin1"], "POST", "/v2/sandboxes/keys", map[string]any{"name": "temp", "role": "member", "user_id": "bob"})
		var k protocol.Key
		if code != 201 || json.Unmarshal([]byte(b), &k) != nil {
			t.Fatalf("create bob's second key: %d %s", code, b)
		}
		took, err := execUntilCut(t, cubicle.New(d.Endpoint, k.Key), "a-box", "echo started; sleep 30", func() {
			if code, b := raw(t, d, keys["admin1"], "DELETE", "/v2/sandboxes/keys/"+k.ID, nil); code/100 != 2 {
				t.Fatalf("revoke bob's second key: %d %s", code, b)
			}
		})
		if err == nil || took > 1500*time.Millisecond {
			t.Fatalf("stream ended after %v with %v, want an error within ~1s", took, err)
		}
	})
	t.Run("revocation cuts an HTTP exec in flight", func(t *testing.T) {
		sh := share(t, map[string]any{"user_id": "bob", "access": "use"})
		type answer struct {
			code int
			body string
		}
		done := make(chan answer, 1)
		go func() {
			code, b := raw(t, d, keys["bob"], "POST", "/dp/"+box.ID+"/execute", map[string]any{"command": "sleep 30"})
			done <- answer{code, b}
		}()
		time.Sleep(time.Second) // the command is running
		at := time.Now()
		if code, b := raw(t, d, keys["alice"], "DELETE", "/v2/sandboxes/boxes/a-box/shares/"+sh.ID, nil); code != 204 {
			t.Fatalf("revoke: %d %s", code, b)
		}
		select {
		case a := <-done:
			if took := time.Since(at); a.code != http.StatusForbidden || !strings.Contains(a.body, "revoked") || took > 1500*time.Millisecond {
				t.Fatalf("HTTP exec ended after %v with %d %s, want a 403 saying revoked within ~1s", took, a.code, a.body)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the HTTP exec outlived the revocation")
		}
	})
	t.Run("owner deletes", func(t *testing.T) {
		if err := alice.DeleteSandbox(ctx, "pa0"); err != nil {
			t.Fatal(err)
		}
		if code, b := raw(t, d, keys["admin1"], "DELETE", "/v2/sandboxes/boxes/pb0", nil); code != 204 {
			t.Fatalf("admin deletes a member's: %d %s", code, b)
		}
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// execUntilCut streams command (which must print "started" first) in
// sandbox box as c, runs cut once it has started, and returns how the
// stream ended and how long after the cut it did.
func execUntilCut(t *testing.T, c *cubicle.Client, box, command string, cut func()) (time.Duration, error) {
	t.Helper()
	started := make(chan struct{})
	var once sync.Once
	out := writerFunc(func(p []byte) (int, error) {
		if bytes.Contains(p, []byte("started")) {
			once.Do(func() { close(started) })
		}
		return len(p), nil
	})
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), box, cubicle.ExecRequest{Command: command, Shell: "/bin/sh", Stdout: out})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("exec ended before the cut: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the command never started")
	}
	at := time.Now()
	cut()
	select {
	case err := <-done:
		return time.Since(at), err
	case <-time.After(5 * time.Second):
		t.Fatal("the exec stream outlived the cut")
	}
	return 0, nil
}

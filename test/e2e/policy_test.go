package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// memberKey adds a member API key for user to the running daemon's default
// workspace and returns it.
func memberKey(t testing.TB, d *daemon, user string) string {
	return addKey(t, d, auth.DefaultWorkspace, user, store.RoleMember)
}

// apiAs sends a JSON request to the control plane with key.
func apiAs(t testing.TB, d *daemon, key, method, path string, body any) (int, string) {
	return raw(t, d, key, method, "/v2/sandboxes"+path, body)
}

// wantPolicy checks that sandbox name is held to the allow list and header
// rule of inheritedPolicy: allowed.test passes, denied.test is refused,
// and a request to secure.test leaves with the workspace secret.
func wantPolicy(t *testing.T, e *egressEnv, name, secret string) {
	t.Helper()
	c := e.d.Client
	allowed(t, c, name, wgetName("allowed.test", e.in.addr(1)), "host=allowed.test")
	deniedFast(t, c, name, wgetName("denied.test", e.in.addr(1)), "403")
	deniedFast(t, c, name, "nc -w 5 "+e.in.addr(3)+" 7000 2>&1 | grep -v 'raw ok'; exit 1", "refused", "unreachable")
	allowed(t, c, name, "egclient -to "+e.in.addr(1)+" https://secure.test/"+name, "auth-present=true")
	if got := e.in.receivedAuth(); len(got) == 0 || got[len(got)-1] != "Bearer "+secret+"|" {
		t.Fatalf("%s: secure.test received %q, want the injected secret", name, got)
	}
}

const inheritedPolicy = `{"access_control":{"allow_list":["allowed.test","secure.test"]},
	"rules":[{"name":"inject","match_hosts":["secure.test"],"headers":[
		{"name":"Authorization","type":"workspace_secret","value":"{FORK_TOKEN}"}]}]}`

// TestForkInheritsPolicy: every branch of an allow-listed sandbox, cold or
// restored from memory, and every sandbox created from its captured
// snapshot, is held to the parent's egress allow list and header rules and
// has its limits, TTLs and run_config — a branch used to get open internet.
// The policy also survives a reset and a daemon crash.
func TestForkInheritsPolicy(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testForkInheritsPolicy(t, rt) })
	}
}

func testForkInheritsPolicy(t *testing.T, rt string) {
	ctx := context.Background()
	e := newEgressEnv(t, rt)
	c := e.d.Client
	const secret = "fork-secret-41c7"
	if code, b := e.api(t, "PUT", "/secrets/FORK_TOKEN", map[string]string{"value": "Bearer " + secret}); code != 200 {
		t.Fatalf("put secret: %d %s", code, b)
	}
	rc := &protocol.RunConfig{EnvVars: map[string]string{"POLICY_MARK": "from-parent"}}
	parent := newSandbox(t, c, e.snap, func(r *protocol.CreateSandboxRequest) {
		r.Name, r.ProxyConfig, r.RunConfig = "pol-parent", json.RawMessage(inheritedPolicy), rc
		r.IdleTTLSeconds, r.DeleteAfterStopSeconds, r.MemBytes = int64p(1200), int64p(600), int64p(384<<20)
	})
	e.upload(t, parent.Name)
	wantPolicy(t, e, parent.Name, secret)

	check := func(t *testing.T, name string) {
		t.Helper()
		wantPolicy(t, e, name, secret)
		got, err := c.GetSandbox(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got.IdleTTLSeconds != 1200 || got.DeleteAfterStopSeconds != 600 || got.MemBytes != 384<<20 || got.VCPUs != parent.VCPUs || got.FSCapacityBytes != parent.FSCapacityBytes {
			t.Fatalf("%s does not have the parent's limits and TTLs: %+v", name, got)
		}
		if out := mustRun(t, c, name, "echo $POLICY_MARK"); out != "from-parent\n" {
			t.Fatalf("%s run_config: POLICY_MARK=%q", name, out)
		}
	}
	t.Run("cold fork", func(t *testing.T) {
		fork, err := c.Fork(ctx, parent.Name, protocol.ForkRequest{Count: 1, Names: []string{"pol-cold"}})
		if err != nil {
			t.Fatal(err)
		}
		check(t, fork.Sandboxes[0].Name)
	})
	if rt == "gvisor" {
		t.Run("memory fork", func(t *testing.T) {
			fork, err := c.Fork(ctx, parent.Name, protocol.ForkRequest{Count: 1, Names: []string{"pol-mem"}, IncludeMemory: true})
			if err != nil {
				t.Fatal(err)
			}
			check(t, fork.Sandboxes[0].Name)
		})
	}
	t.Run("create from capture", func(t *testing.T) {
		sn, err := c.CaptureSnapshot(ctx, parent.Name, protocol.CaptureSnapshotRequest{Name: "pol-capture", IncludeMemory: rt == "gvisor"})
		if err != nil {
			t.Fatal(err)
		}
		inherited := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "pol-from-capture" })
		wantPolicy(t, e, inherited.Name, secret)
		// An explicit proxy_config replaces the inherited one.
		open := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) {
			r.Name, r.ProxyConfig = "pol-explicit", json.RawMessage(`{}`)
		})
		allowed(t, c, open.Name, wgetName("denied.test", e.in.addr(1)), "host=denied.test")
	})
	t.Run("after a reset", func(t *testing.T) {
		if _, err := c.ResetSandbox(ctx, "pol-cold", ""); err != nil {
			t.Fatal(err)
		}
		wantPolicy(t, e, "pol-cold", secret)
	})
	t.Run("after a daemon crash", func(t *testing.T) {
		e.d.kill9()
		e.d.restart()
		wantPolicy(t, e, "pol-cold", secret)
	})
}

// TestSecretReferenceNeedsGrant: a member cannot read a workspace secret
// it may not list by referencing it in a proxy rule toward a host it
// controls — not on create, not on PATCH, not by creating from an admin's
// captured snapshot whose rules reference it, not by forking a sandbox an
// admin gave such a rule. A secret an admin PUT with members_may_use is
// listed for members and usable by them.
func TestSecretReferenceNeedsGrant(t *testing.T) {
	ctx := context.Background()
	e := newEgressEnv(t, "namespace", "attacker.test")
	const hidden = "admin-only-5a1f"
	for name, body := range map[string]any{
		"ADMIN_ONLY": map[string]any{"value": hidden},
		"SHARED":     map[string]any{"value": "shared-value", "members_may_use": true},
	} {
		if code, b := e.api(t, "PUT", "/secrets/"+name, body); code != 200 {
			t.Fatalf("put %s: %d %s", name, code, b)
		}
	}
	key := memberKey(t, e.d, "mallory")
	member := cubicle.New(e.d.Endpoint, key)
	shareWithWorkspace(t, e.d.Client, e.snap)
	steal := func(name string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"rules":[{"name":"steal","match_hosts":["attacker.test"],"headers":[
			{"name":"Authorization","type":"workspace_secret","value":"{%s}"}]}]}`, name))
	}
	wantForbidden := func(t *testing.T, what string, code int, body string) {
		t.Helper()
		if code != http.StatusForbidden || !strings.Contains(body, "ADMIN_ONLY") || strings.Contains(body, hidden) {
			t.Fatalf("%s: %d %s, want 403 naming the secret", what, code, body)
		}
	}

	t.Run("members list only granted secrets", func(t *testing.T) {
		code, b := apiAs(t, e.d, key, "GET", "/secrets", nil)
		if code != 200 || !strings.Contains(b, `"SHARED"`) || strings.Contains(b, "ADMIN_ONLY") {
			t.Fatalf("member lists %d %s", code, b)
		}
	})
	t.Run("create", func(t *testing.T) {
		code, b := apiAs(t, e.d, key, "POST", "/boxes", map[string]any{"name": "steal-create", "snapshot_id": e.snap, "proxy_config": steal("ADMIN_ONLY")})
		wantForbidden(t, "create", code, b)
		if _, err := member.GetSandbox(ctx, "steal-create"); err == nil {
			t.Fatal("the refused sandbox exists")
		}
	})
	var own *protocol.Sandbox
	t.Run("a granted secret is usable", func(t *testing.T) {
		var err error
		own, err = member.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "mallory-box", SnapshotID: e.snap, ProxyConfig: steal("SHARED")})
		if err != nil {
			t.Fatal(err)
		}
	})
	if own == nil {
		t.FailNow()
	}
	t.Run("PATCH", func(t *testing.T) {
		code, b := apiAs(t, e.d, key, "PATCH", "/boxes/"+own.Name, map[string]any{"proxy_config": steal("ADMIN_ONLY")})
		wantForbidden(t, "patch", code, b)
	})
	t.Run("create from an admin's capture", func(t *testing.T) {
		adminBox := newSandbox(t, e.d.Client, e.snap, func(r *protocol.CreateSandboxRequest) {
			r.Name, r.ProxyConfig = "admin-box", steal("ADMIN_ONLY")
		})
		sn, err := e.d.Client.CaptureSnapshot(ctx, adminBox.Name, protocol.CaptureSnapshotRequest{Name: "admin-capture"})
		if err != nil {
			t.Fatal(err)
		}
		// A captured snapshot is private to its creator: share it, so the
		// secret check is what refuses the create.
		if code, b := e.api(t, "POST", "/snapshots/"+sn.ID+"/shares", map[string]any{"user_id": "mallory", "access": "use"}); code != 201 {
			t.Fatalf("share the capture: %d %s", code, b)
		}
		code, b := apiAs(t, e.d, key, "POST", "/boxes", map[string]any{"name": "steal-inherit", "snapshot_id": sn.ID})
		wantForbidden(t, "create from capture", code, b)
	})
	t.Run("fork", func(t *testing.T) {
		// An admin gives the member's sandbox a rule with the secret; the
		// member may not copy it into branches of its own.
		if code, b := e.api(t, "PATCH", "/boxes/"+own.Name, map[string]any{"proxy_config": steal("ADMIN_ONLY")}); code != 200 {
			t.Fatalf("admin patch: %d %s", code, b)
		}
		before, err := e.d.Client.ListSnapshots(ctx, cubicle.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		code, b := apiAs(t, e.d, key, "POST", "/boxes/"+own.Name+"/fork", map[string]any{"count": 1, "names": []string{"steal-fork"}})
		wantForbidden(t, "fork", code, b)
		after, err := e.d.Client.ListSnapshots(ctx, cubicle.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(after.Snapshots) != len(before.Snapshots) {
			t.Fatalf("a refused fork left a snapshot: %d → %d", len(before.Snapshots), len(after.Snapshots))
		}
	})
	for _, a := range e.in.receivedAuth() {
		if strings.Contains(a, hidden) {
			t.Fatalf("the hidden secret reached the internet: %q", a)
		}
	}
}

// TestNameCannotShadowID: a sandbox or snapshot cannot be named like a
// UUID (422 naming the field on create, rename and capture), and a lookup
// by id wins over a record whose name is that id (one made before the
// rule): the admin's DELETE /boxes/<id> deletes the sandbox with that id.
func TestNameCannotShadowID(t *testing.T) {
	ctx := context.Background()
	d := startDaemon(t, "namespace", "")
	c := d.Client
	sn := readySnapshot(t, c, "shadow", testImage(t))
	victim := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "victim" })
	other := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "other" })
	want422 := func(what string, code int, body string) {
		t.Helper()
		if code != http.StatusUnprocessableEntity || !strings.Contains(body, `name`) || !strings.Contains(body, "UUID") {
			t.Fatalf("%s: %d %s, want 422 naming the field", what, code, body)
		}
	}
	code, b := apiAs(t, d, testKey, "POST", "/boxes", map[string]any{"name": victim.ID, "snapshot_id": sn.ID})
	want422("create", code, b)
	code, b = apiAs(t, d, testKey, "POST", "/boxes", map[string]any{"name": strings.ToUpper(victim.ID), "snapshot_id": sn.ID})
	want422("create upper-case", code, b)
	code, b = apiAs(t, d, testKey, "PATCH", "/boxes/"+other.Name, map[string]any{"name": victim.ID})
	want422("rename", code, b)
	code, b = apiAs(t, d, testKey, "POST", "/boxes/"+other.Name+"/snapshot", map[string]any{"name": sn.ID})
	want422("capture", code, b)
	code, b = apiAs(t, d, testKey, "POST", "/snapshots", map[string]any{"name": sn.ID, "docker_image": "x", "fs_capacity_bytes": 1 << 30})
	want422("snapshot", code, b)

	// A decoy from before the rule, named like the victim's id.
	st, err := store.OpenSQLite(ctx, filepath.Join(d.dataDir, "cubicle.db"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	decoy := &store.Sandbox{ID: uuid.NewString(), WorkspaceID: auth.DefaultWorkspace, CreatedBy: "admin", Name: victim.ID,
		Status: protocol.StatusStopped, SnapshotID: sn.ID, Runtime: "namespace", VCPUs: 1, MemBytes: 256 << 20,
		FSCapacityBytes: 1 << 30, Token: "x", CreatedAt: now, UpdatedAt: now, StoppedAt: &now}
	err = st.CreateSandbox(ctx, decoy)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, victim.ID); err != nil || got.ID != victim.ID {
		t.Fatalf("GET /boxes/<victim id> = %+v, %v", got, err)
	}
	if err := c.DeleteSandbox(ctx, victim.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, decoy.ID); err != nil || got.Name != victim.ID {
		t.Fatalf("the decoy was deleted instead: %+v, %v", got, err)
	}
	if err := c.DeleteSandbox(ctx, decoy.ID); err != nil {
		t.Fatal(err)
	}
}

package api

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// TestAuthRequired: every API route needs a valid key; missing or bad keys
// are 401 in the structured form and never reach the manager.
func TestAuthRequired(t *testing.T) {
	ta := newTestAPI(t, true)
	for _, key := range []string{"", "wrong"} {
		for _, route := range []string{"GET /v2/sandboxes/boxes", "POST /api/v2/sandboxes/boxes", "GET /dp/id-bobs/download?path=/x",
			"POST /v2/sandboxes/boxes/bobs/service-url", "GET /v2/sandboxes/secrets"} {
			method, path, _ := strings.Cut(route, " ")
			st, body := ta.do(t, method, path, key, map[string]any{})
			if st != http.StatusUnauthorized || detailError(body) != "Unauthorized" {
				t.Errorf("%s with key %q: %d %v, want 401 Unauthorized", route, key, st, body)
			}
		}
	}
	if len(ta.mgr.calls) != 0 {
		t.Fatalf("unauthenticated requests reached the manager: %v", ta.mgr.calls)
	}
}

// TestRouting: every control-plane prefix serves the same routes; unknown
// paths are a structured 404; gateway routes exist only with a gateway;
// a host-form service address goes to the gateway whatever the path.
func TestRouting(t *testing.T) {
	ta := newTestAPI(t, true)
	for _, p := range prefixes {
		if st, body := ta.do(t, "GET", p+"/boxes/bobs", memberKey, nil); st != 200 || field(body, "name") != "bobs" {
			t.Fatalf("GET %s/boxes/bobs: %d %v", p, st, body)
		}
	}
	if st, body := ta.do(t, "GET", "/v3/nothing", adminKey, nil); st != 404 || detailError(body) != "NotFound" {
		t.Fatalf("unknown path: %d %v", st, body)
	}
	st, body := ta.do(t, "GET", "/healthz", "", nil)
	if st != 200 || field(body, "runtime") != "fake-runtime" || field(body, "storage") != "fake-storage" ||
		fmt.Sprint(body.(map[string]any)["runtimes"]) != "[map[name:fake-runtime]]" {
		t.Fatalf("healthz: %d %v", st, body)
	}
	req := httptest.NewRequest("GET", "/v2/sandboxes/boxes", nil)
	req.Host = "x-8080.svc.test"
	rec := httptest.NewRecorder()
	ta.srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot {
		t.Fatalf("service host went to %d, not the gateway", rec.Code)
	}

	bare := newTestAPI(t, false)
	for _, path := range []string{"/v2/sandboxes/boxes/bobs/service-url", "/v2/sandboxes/boxes/bobs/download-url"} {
		if st, _ := bare.do(t, "POST", path, adminKey, map[string]any{"port": 80, "path": "/x"}); st != 404 {
			t.Fatalf("%s without a gateway: %d, want 404", path, st)
		}
	}
	if st, _ := bare.do(t, "GET", "/d/good", "", nil); st != 404 {
		t.Fatalf("download link without a gateway: %d, want 404", st)
	}
}

// TestVisibility: a member sees its own sandboxes and gets 404 (not 403)
// for another's; an admin sees both. The principal the key names is what
// the manager is called with.
func TestVisibility(t *testing.T) {
	ta := newTestAPI(t, true)
	for _, c := range []struct {
		key, name string
		want      int
	}{
		{memberKey, "bobs", 200}, {memberKey, "anns", 404}, {adminKey, "anns", 200}, {adminKey, "bobs", 200},
	} {
		for _, route := range []string{"GET /boxes/%s", "GET /boxes/%s/status", "POST /boxes/%s/stop", "POST /boxes/%s/start",
			"PATCH /boxes/%s", "POST /boxes/%s/reset", "GET /boxes/%s/egress-log"} {
			method, path, _ := strings.Cut(fmt.Sprintf(route, c.name), " ")
			st, body := ta.do(t, method, "/v2/sandboxes"+path, c.key, map[string]any{})
			if st != c.want {
				t.Errorf("%s %s as %s: %d %v, want %d", method, path, c.key, st, body, c.want)
			}
		}
	}
	if st, _ := ta.do(t, "DELETE", "/v2/sandboxes/boxes/anns", memberKey, nil); st != 404 {
		t.Fatalf("member deleted another's sandbox: %d", st)
	}
	if _, ok := ta.mgr.sandboxes["anns"]; !ok {
		t.Fatal("anns is gone after a member's delete")
	}
	if st, _ := ta.do(t, "DELETE", "/v2/sandboxes/boxes/anns", adminKey, nil); st != 204 {
		t.Fatalf("admin delete: %d, want 204", st)
	}
}

// TestUnknownFieldsRefused: a misspelt member anywhere in a body is a 422
// naming it (extra_forbidden) and the manager is never called: the typo'd
// allowlist that used to leave egress open now fails the create.
func TestUnknownFieldsRefused(t *testing.T) {
	for _, c := range []struct {
		method, path string
		body         string
		loc          string
	}{
		{"POST", "/v2/sandboxes/boxes", `{"name":"x","proxy_config":{"access_control":{"allowlist":["pypi.org"]}}}`, "body/proxy_config.access_control.allowlist"},
		{"POST", "/v2/sandboxes/boxes", `{"name":"x","idle_ttl":60}`, "body/idle_ttl"},
		{"POST", "/v2/sandboxes/boxes", `{"name":"x","run_config":{"env":{"A":"1"}}}`, "body/run_config.env"},
		{"PATCH", "/v2/sandboxes/boxes/bobs", `{"proxy_config":{"rules":[{"name":"r","match_host":["a"]}]}}`, "body/proxy_config.rules[0].match_host"},
		{"POST", "/v2/sandboxes/snapshots", `{"name":"s","docker_image":"x","fs_capacity":1}`, "body/fs_capacity"},
		{"POST", "/v2/sandboxes/boxes/bobs/snapshot", `{"name":"s","include_mem":true}`, "body/include_mem"},
		{"POST", "/v2/sandboxes/boxes/bobs/fork", `{"count":1,"name":"x"}`, "body/name"},
		{"POST", "/v2/sandboxes/boxes/bobs/stop", `{"force":true}`, "body/force"},
		{"POST", "/v2/sandboxes/boxes/bobs/service-url", `{"port":80,"ttl":5}`, "body/ttl"},
		{"POST", "/v2/sandboxes/boxes/bobs/download-url", `{"path":"/x","filename":"y"}`, "body/filename"},
		{"PUT", "/v2/sandboxes/secrets/TOKEN", `{"value":"v","shared":true}`, "body/shared"},
		{"POST", "/dp/id-bobs/execute", `{"command":"ls","workdir":"/"}`, "body/workdir"},
		{"POST", "/dp/id-bobs/glob", `{"pattern":"*","paths":["/"]}`, "body/paths"},
	} {
		ta := newTestAPI(t, true)
		st, body := ta.do(t, c.method, c.path, adminKey, c.body)
		loc, typ := validation(body)
		if st != 422 || loc != c.loc || typ != extraForbidden {
			t.Errorf("%s %s %s: %d %v, want 422 at %s", c.method, c.path, c.body, st, body, c.loc)
		}
		if len(ta.mgr.calls) != 0 {
			t.Errorf("%s %s: the manager was called (%v) for a refused body", c.method, c.path, ta.mgr.calls)
		}
	}
}

// TestClientFields: the members the official clients send are accepted;
// snapshot (Python) reaches the manager as snapshot_id, name:tag whole;
// mount_config reaches the manager as sent (it checks it: internal/mounts),
// and malformed access delegations are refused naming the field.
func TestClientFields(t *testing.T) {
	ta := newTestAPI(t, true)
	st, body := ta.do(t, "POST", "/v2/sandboxes/boxes", memberKey, `{"wait_for_ready":true,"timeout":30,"snapshot":"base:latest","name":"n1",
		"idle_ttl_seconds":600,"delete_after_stop_seconds":0,"vcpus":1,"mem_bytes":268435456,"fs_capacity_bytes":1073741824,
		"proxy_config":{"rules":[],"access_control":{"deny_list":["169.254.169.254"]},"no_proxy":[]},
		"run_config":{"user":"0","work_dir":"/","env_vars":{"A":"1"}},"access_delegation":{"mode":"INHERIT"}}`)
	if st != 201 || field(body, "name") != "n1" || field(body, "dataplane_url") != "http://api.test/dp/id-n1" {
		t.Fatalf("create with every client field: %d %v", st, body)
	}
	if ta.mgr.create.SnapshotID != "base:latest" || ta.mgr.create.Snapshot != "" {
		t.Fatalf("snapshot reached the manager as %+v", ta.mgr.create)
	}
	for _, body := range []string{
		`{"snapshot_id":"sn1","name":"n2","access_delegation":{"mode":"EXPLICIT","permissions":["read"]}}`,
		`{"snapshot":"base","snapshot_name":"base","name":"n3"}`,
		`{"name":"n4","mount_config":null}`,
		`{"name":"n5","mount_config":{"mounts":[{"id":"g","type":"git","mount_path":"/r","git":{"remote_url":"https://h/r"}}]}}`,
	} {
		if st, resp := ta.do(t, "POST", "/v2/sandboxes/boxes", memberKey, body); st != 201 {
			t.Fatalf("%s: %d %v", body, st, resp)
		}
	}
	if got := string(ta.mgr.create.MountConfig); !strings.Contains(got, `"remote_url":"https://h/r"`) {
		t.Fatalf("mount_config reached the manager as %q", got)
	}
	for _, c := range []struct{ body, loc string }{
		{`{"access_delegation":{"mode":"EXPLICIT"}}`, "body/access_delegation.permissions"},
		{`{"access_delegation":{"mode":"INHERIT","permissions":["x"]}}`, "body/access_delegation.permissions"},
		{`{"access_delegation":{"mode":"ALL"}}`, "body/access_delegation.mode"},
		{`{"snapshot":"a","snapshot_id":"b"}`, "body/snapshot"},
		{`{"snapshot":"a","snapshot_name":"b"}`, "body/snapshot"},
		{`{"vcpus":"two"}`, "body/vcpus"},
	} {
		st, resp := ta.do(t, "POST", "/v2/sandboxes/boxes", memberKey, c.body)
		if loc, typ := validation(resp); st != 422 || loc != c.loc || typ != valueError {
			t.Errorf("%s: %d %v, want 422 at %s", c.body, st, resp, c.loc)
		}
	}
	for _, c := range []struct{ path, body string }{
		{"/v2/sandboxes/snapshots", `{"name":"s","docker_image":"busybox","fs_capacity_bytes":1,"tag":"v1","registry_id":"r","run_config":{"user":"0"}}`},
		{"/v2/sandboxes/boxes/bobs/snapshot", `{"name":"s2","tag":"v1","fs_capacity_bytes":1,"run_config":{}}`},
	} {
		if st, resp := ta.do(t, "POST", c.path, memberKey, c.body); st != 201 {
			t.Fatalf("%s %s: %d %v", c.path, c.body, st, resp)
		}
	}
}

// TestErrorMapping: each error kind a service returns becomes its status
// and body, in one place.
func TestErrorMapping(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		kind   string // detail.error, or "422:<loc>" for the Pydantic form
	}{
		{fmt.Errorf("x: %w", errdefs.ErrNotFound), 404, "NotFound"},
		{fmt.Errorf("x: %w", errdefs.ErrConflict), 409, "Conflict"},
		{fmt.Errorf("x: %w", errdefs.ErrNotReady), 400, "NotReady"},
		{fmt.Errorf("x: %w", errdefs.ErrTimeout), 408, "Timeout"},
		{fmt.Errorf("x: %w", errdefs.ErrUnauthorized), 401, "Unauthorized"},
		{fmt.Errorf("x: %w", errdefs.ErrForbidden), 403, "Forbidden"},
		{fmt.Errorf("x: %w", errdefs.ErrTooLarge), 413, "TooLarge"},
		{fmt.Errorf("x: %w", errdefs.ErrUnavailable), 502, "ConnectionError"},
		{fmt.Errorf("x: %w", sandbox.ErrInvalidRequest), 400, "InvalidRequest"},
		{&sandbox.BootError{Err: errors.New("agent exited")}, 422, "CrashLoop"},
		{fmt.Errorf("x: %w", context.Canceled), 499, "Canceled"},
		{errors.New("disk on fire"), 500, "InternalError"},
		{errdefs.Field("vcpus", "must be at most 8"), 422, "422:body/vcpus"},
		{fmt.Errorf("bad: %w", errdefs.ErrInvalid), 422, "422:body"},
	} {
		ta := newTestAPI(t, true)
		ta.mgr.fail = c.err
		st, body := ta.do(t, "GET", "/v2/sandboxes/boxes/bobs", adminKey, nil)
		got := detailError(body)
		if strings.HasPrefix(c.kind, "422:") {
			loc, _ := validation(body)
			got = "422:" + loc
		}
		if st != c.status || got != c.kind {
			t.Errorf("%v: %d %v, want %d %s", c.err, st, body, c.status, c.kind)
		}
	}
}

// TestPagination: limit and offset reach the store; out-of-range values
// are 422s naming the parameter; next_cursor is the next offset on a full
// page with another after it and null on the last; items mirrors the named
// list.
func TestPagination(t *testing.T) {
	ta := newTestAPI(t, true)
	for _, list := range []string{"/v2/sandboxes/boxes", "/v2/sandboxes/snapshots"} {
		for _, q := range []struct{ query, param string }{
			{"limit=0", "limit"}, {"limit=501", "limit"}, {"limit=x", "limit"}, {"offset=-1", "offset"}, {"offset=1.5", "offset"},
		} {
			st, body := ta.do(t, "GET", list+"?"+q.query, memberKey, nil)
			if loc, _ := validation(body); st != 422 || loc != "body/"+q.param {
				t.Errorf("%s?%s: %d %v", list, q.query, st, body)
			}
		}
		ta.mgr.listN = 3 // the store is asked for one more than the page
		st, body := ta.do(t, "GET", list+"?limit=2&offset=4&name_contains=bo", memberKey, nil)
		if items, _ := field(body, "items").([]any); st != 200 || field(body, "next_cursor") != "6" || field(body, "offset") != float64(4) || len(items) != 2 {
			t.Fatalf("%s full page: %d %v", list, st, body)
		}
		if o := ta.mgr.list; o.Limit != 3 || o.Offset != 4 || o.NameContains != "bo" {
			t.Fatalf("%s: store got %+v", list, o)
		}
		ta.mgr.listN = 2
		st, body = ta.do(t, "GET", list+"?limit=2&offset=4", memberKey, nil)
		items, _ := field(body, "items").([]any)
		if st != 200 || field(body, "next_cursor") != nil || len(items) != 2 {
			t.Fatalf("%s short page: %d %v", list, st, body)
		}
		ta.mgr.listN = 0
		if _, body = ta.do(t, "GET", list, memberKey, nil); ta.mgr.list.Limit != 51 || ta.mgr.list.Offset != 0 {
			t.Fatalf("%s default page: store got %+v (%v)", list, ta.mgr.list, body)
		}
	}
	ta.mgr.listN = 1
	_, body := ta.do(t, "GET", "/v2/sandboxes/snapshots", memberKey, nil)
	snaps, _ := field(body, "snapshots").([]any)
	if len(snaps) != 1 || field(snaps[0], "run_config") != nil {
		t.Fatalf("snapshot list carries run_config: %v", body)
	}
}

// TestControlPlane: the happy paths answer the documented status and
// JSON: create 201, get with usage, status, stop/start 200, delete 204,
// snapshots, capture, fork, reset and diff.
func TestControlPlane(t *testing.T) {
	ta := newTestAPI(t, true)
	st, body := ta.do(t, "GET", "/v2/sandboxes/boxes/bobs", memberKey, nil)
	if st != 200 || field(body, "fs_used_bytes") != float64(111) || field(body, "status") != "ready" {
		t.Fatalf("get: %d %v", st, body)
	}
	st, body = ta.do(t, "GET", "/v2/sandboxes/boxes/anns/status", adminKey, nil)
	if st != 200 || field(body, "status") != "stopped" || field(body, "status_message") != "idle" {
		t.Fatalf("status: %d %v", st, body)
	}
	if st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/stop", memberKey, "{}"); st != 200 || field(body, "status") != "stopped" {
		t.Fatalf("stop: %d %v", st, body)
	}
	if st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/start", memberKey, ""); st != 200 || field(body, "status") != "ready" {
		t.Fatalf("start: %d %v", st, body)
	}
	st, body = ta.do(t, "PATCH", "/v2/sandboxes/boxes/bobs", memberKey, `{"idle_ttl_seconds":120,"proxy_config":{"access_control":{"allow_list":["a.com"]}}}`)
	if st != 200 || ta.mgr.update.IdleTTLSeconds == nil || *ta.mgr.update.IdleTTLSeconds != 120 || string(ta.mgr.update.ProxyConfig) == "" {
		t.Fatalf("patch: %d %v, manager got %+v", st, body, ta.mgr.update)
	}

	st, body = ta.do(t, "POST", "/v2/sandboxes/snapshots", memberKey, map[string]any{"name": "s", "docker_image": "busybox", "fs_capacity_bytes": 1 << 30})
	if st != 201 || field(body, "status") != "building" || field(body, "pull_bytes_total") != float64(10) {
		t.Fatalf("create snapshot: %d %v", st, body)
	}
	st, body = ta.do(t, "GET", "/v2/sandboxes/snapshots/sn1", memberKey, nil)
	rc, _ := field(body, "run_config").(map[string]any)
	if st != 200 || field(body, "fs_used_bytes") != float64(222) || rc["user"] != "0" {
		t.Fatalf("get snapshot: %d %v", st, body)
	}
	if st, body = ta.do(t, "GET", "/v2/sandboxes/snapshots/nope", memberKey, nil); st != 404 {
		t.Fatalf("missing snapshot: %d %v", st, body)
	}
	if st, _ = ta.do(t, "DELETE", "/v2/sandboxes/snapshots/sn1", adminKey, nil); st != 204 || !ta.mgr.called("LayersInUse") || ta.images.gcInUse[0] != "layer-in-use" {
		t.Fatalf("delete snapshot: %d; image GC ran with %v", st, ta.images.gcInUse)
	}

	if st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/snapshot", memberKey, map[string]any{"name": "cap"}); st != 201 || field(body, "source_sandbox_id") != "id-bobs" {
		t.Fatalf("capture: %d %v", st, body)
	}
	st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/fork", memberKey, map[string]any{"count": 2})
	if sbs, _ := field(body, "sandboxes").([]any); st != 201 || field(body, "snapshot_id") != "fork-snap" || len(sbs) != 2 {
		t.Fatalf("fork: %d %v", st, body)
	}
	if st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/reset", memberKey, map[string]any{"snapshot_id": "sn1"}); st != 200 || field(body, "snapshot_id") != "sn1" {
		t.Fatalf("reset: %d %v", st, body)
	}
	st, body = ta.do(t, "GET", "/v2/sandboxes/diff?a=bobs&b=x", memberKey, nil)
	if ch, _ := field(body, "changes").([]any); st != 200 || len(ch) != 1 || field(ch[0], "path") != "/etc/x" {
		t.Fatalf("diff: %d %v", st, body)
	}
	if st, body = ta.do(t, "GET", "/v2/sandboxes/diff?a=bobs", memberKey, nil); st != 422 {
		t.Fatalf("diff without b: %d %v", st, body)
	}
}

// TestAdminOnly: image names and secrets are workspace-wide, so loading
// and removing images and writing secrets are forbidden to members (403,
// nothing changed) and allowed to admins.
func TestAdminOnly(t *testing.T) {
	ta := newTestAPI(t, true)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v2/sandboxes/images/load?name=x", "tarball"},
		{"DELETE", "/v2/sandboxes/images/docker.io/library/busybox:latest", ""},
		{"PUT", "/v2/sandboxes/secrets/TOKEN", `{"value":"v"}`},
		{"DELETE", "/v2/sandboxes/secrets/TOKEN", ""},
	} {
		if st, body := ta.do(t, c.method, c.path, memberKey, c.body); st != 403 || detailError(body) != "Forbidden" {
			t.Errorf("member %s %s: %d %v, want 403", c.method, c.path, st, body)
		}
	}
	if ta.images.loaded != "" || ta.images.removed != "" || len(ta.vault.put) != 0 {
		t.Fatalf("a member's refused call changed state: %+v %+v", ta.images, ta.vault.put)
	}

	st, body := ta.do(t, "POST", "/v2/sandboxes/images/load?name=x", adminKey, "tarball")
	if imgs, _ := field(body, "images").([]any); st != 200 || ta.images.loaded != "w1:x:tarball" || len(imgs) != 1 {
		t.Fatalf("admin load: %d %v (%q)", st, body, ta.images.loaded)
	}
	st, body = ta.do(t, "DELETE", "/v2/sandboxes/images/docker.io/library/busybox:latest", adminKey, nil)
	if st != 200 || ta.images.removed != "w1:docker.io/library/busybox:latest" || field(body, "freed_bytes") != float64(300) {
		t.Fatalf("admin remove: %d %v", st, body)
	}
	if st, body = ta.do(t, "DELETE", "/v2/sandboxes/images/missing", adminKey, nil); st != 404 {
		t.Fatalf("remove missing: %d %v", st, body)
	}
	st, body = ta.do(t, "GET", "/v2/sandboxes/images", memberKey, nil)
	if imgs, _ := field(body, "images").([]any); st != 200 || len(imgs) != 1 || field(body, "usage_bytes") != float64(42) {
		t.Fatalf("list images: %d %v", st, body)
	}

	for _, c := range []struct{ path, body, loc string }{
		{"/v2/sandboxes/secrets/1BAD", `{"value":"v"}`, "body/name"},
		{"/v2/sandboxes/secrets/TOKEN", `{}`, "body/value"},
		{"/v2/sandboxes/secrets/TOKEN", `{"value":5}`, "body/value"},
	} {
		st, body := ta.do(t, "PUT", c.path, adminKey, c.body)
		if loc, _ := validation(body); st != 422 || loc != c.loc {
			t.Errorf("PUT %s %s: %d %v, want 422 at %s", c.path, c.body, st, body, c.loc)
		}
	}
	if st, body = ta.do(t, "PUT", "/v2/sandboxes/secrets/TOKEN", adminKey, `{"value":"s3cret","members_may_use":true}`); st != 200 || field(body, "members_may_use") != true {
		t.Fatalf("admin put: %d %v", st, body)
	}
	if ta.vault.put["w1/TOKEN"] != "s3cret" {
		t.Fatalf("vault holds %v", ta.vault.put)
	}
	st, body = ta.do(t, "GET", "/v2/sandboxes/secrets", adminKey, nil)
	if list, _ := field(body, "secrets").([]any); st != 200 || len(list) != 1 || strings.Contains(fmt.Sprint(body), "s3cret") {
		t.Fatalf("list secrets: %d %v", st, body)
	}
	if st, _ = ta.do(t, "DELETE", "/v2/sandboxes/secrets/TOKEN", adminKey, nil); st != 204 {
		t.Fatalf("admin delete secret: %d", st)
	}
	if st, _ = ta.do(t, "DELETE", "/v2/sandboxes/secrets/TOKEN", adminKey, nil); st != 404 {
		t.Fatalf("delete missing secret: %d", st)
	}
	if st, body = ta.do(t, "GET", "/v2/sandboxes/boxes/bobs/egress-log", memberKey, nil); st != 200 || field(body, "mode") != "allow_list:id-bobs" {
		t.Fatalf("egress log: %d %v", st, body)
	}
}

// TestLinks: service and download URL requests are bounded (422 naming the
// field) before anything is minted; valid ones answer the gateway's link.
func TestLinks(t *testing.T) {
	ta := newTestAPI(t, true)
	for _, c := range []struct{ body, loc string }{
		{`{"port":0}`, "body/port"},
		{`{"port":65536}`, "body/port"},
		{fmt.Sprintf(`{"port":%d}`, agent.Port), "body/port"},
		{`{"port":80,"access":"public"}`, "body/access"},
		{`{"port":80,"access":"workspace","expires_in_seconds":5}`, "body/expires_in_seconds"},
		{`{"port":80,"expires_in_seconds":0}`, "body/expires_in_seconds"},
		{`{"port":80,"expires_in_seconds":999999999}`, "body/expires_in_seconds"},
		{`{"port":80,"embed_origins":["http://evil.example"]}`, "body/embed_origins[0]"},
		{`{"port":80,"embed_origins":["https://a.example/path"]}`, "body/embed_origins[0]"},
		{`{"port":80,"embed_origins":["https://a","https://b","https://c","https://d","https://e","https://f"]}`, "body/embed_origins"},
	} {
		st, body := ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/service-url", memberKey, c.body)
		if loc, _ := validation(body); st != 422 || loc != c.loc {
			t.Errorf("service-url %s: %d %v, want 422 at %s", c.body, st, body, c.loc)
		}
	}
	st, body := ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/service-url", memberKey, `{"port":8080}`)
	if st != 200 || field(body, "token") != "tok" || field(body, "expires_at") != "2030-01-01T00:00:00Z" || ta.gw.ttl != defaultServiceTTL {
		t.Fatalf("service-url: %d %v (ttl %v)", st, body, ta.gw.ttl)
	}
	if field(body, "embed_url") != nil {
		t.Fatalf("embed_url without embed_origins: %v", body)
	}
	st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/service-url", memberKey, `{"port":8080,"embed_origins":["https://App.example:8443/","http://localhost:3000","https://app.example:8443"]}`)
	if st != 200 || field(body, "embed_url") != "http://embed" || fmt.Sprint(ta.gw.embed) != "[https://app.example:8443 http://localhost:3000]" {
		t.Fatalf("service-url with embed_origins: %d %v (gateway got %v)", st, body, ta.gw.embed)
	}
	if st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/service-url", memberKey, `{"port":8080,"access":"restricted"}`); st != 200 || field(body, "access") != "restricted" || field(body, "token") != nil {
		t.Fatalf("login-mode service-url: %d %v", st, body)
	}
	if st, _ = ta.do(t, "POST", "/v2/sandboxes/boxes/anns/service-url", memberKey, `{"port":8080}`); st != 404 {
		t.Fatalf("member minted a service URL for another's sandbox: %d", st)
	}

	for _, c := range []struct{ body, loc string }{
		{`{}`, "body/path"},
		{`{"path":"rel/x"}`, "body/path"},
		{`{"path":"/x\u0000y"}`, "body/path"},
		{`{"path":"/x","content_type":"text/html\r\nX-Evil: 1"}`, "body/content_type"},
		{`{"path":"/x","content_type":"not a type"}`, "body/content_type"},
		{`{"path":"/x","content_disposition":"download"}`, "body/content_disposition"},
		{`{"path":"/x","expires_in_seconds":0}`, "body/expires_in_seconds"},
	} {
		st, body := ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/download-url", memberKey, c.body)
		if loc, _ := validation(body); st != 422 || loc != c.loc {
			t.Errorf("download-url %s: %d %v, want 422 at %s", c.body, st, body, c.loc)
		}
	}
	st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/download-url", memberKey, `{"path":"/f","content_type":"text/plain; charset=utf-8","content_disposition":"inline"}`)
	if st != 200 || field(body, "download_url") != "http://d/id-bobs/f" || field(body, "expires_at") != nil {
		t.Fatalf("download-url: %d %v", st, body)
	}
	if st, body = ta.do(t, "POST", "/v2/sandboxes/boxes/bobs/download-url", memberKey, `{"path":"/f","expires_in_seconds":60}`); st != 200 || field(body, "expires_at") == nil {
		t.Fatalf("expiring download-url: %d %v", st, body)
	}
	if st, body = ta.do(t, "GET", "/d/forged", "", nil); st != 401 {
		t.Fatalf("forged download link: %d %v", st, body)
	}
	if st, body = ta.do(t, "GET", "/d/good", "", nil); st != 404 || !ta.mgr.called("GrantDataplane") {
		t.Fatalf("download link: %d %v (calls %v)", st, body, ta.mgr.calls)
	}
}

// TestDataplaneArguments: dataplane requests with missing or malformed
// arguments are 422s naming them, checked before the sandbox is touched
// (no wake-up for a bad request).
func TestDataplaneArguments(t *testing.T) {
	for _, c := range []struct {
		method, path, body, loc string
	}{
		{"POST", "/dp/id-bobs/execute", `{}`, "body/command"},
		{"POST", "/dp/id-bobs/execute", `{"command":"ls","timeout":"x"}`, "body/timeout"},
		{"POST", "/dp/id-bobs/glob", `{"pattern":"*","path":"rel"}`, "body/path"},
		{"POST", "/dp/id-bobs/glob", `{"pattern":"*","path":"/a\u0000"}`, "body/path"},
		{"POST", "/dp/id-bobs/glob", `{"pattern":"*","path":"/","limit":-1}`, "body/limit"},
		{"POST", "/dp/id-bobs/glob", `{"pattern":"*","path":"/","limit":100001}`, "body/limit"},
		{"POST", "/dp/id-bobs/grep", `{"path":"/"}`, "body/pattern"},
		{"POST", "/dp/id-bobs/grep", `{"pattern":"x","path":"/","glob":5}`, "body/glob"},
		{"POST", "/dp/id-bobs/upload", "", "body/path"},
		{"POST", "/dp/id-bobs/upload?path=/a%00b", "", "body/path"},
		{"GET", "/dp/id-bobs/download", "", "body/path"},
		{"HEAD", "/dp/id-bobs/download", "", ""},
	} {
		ta := newTestAPI(t, true)
		st, body := ta.do(t, c.method, c.path, memberKey, c.body)
		if loc, _ := validation(body); st != 422 || loc != c.loc && c.method != "HEAD" {
			t.Errorf("%s %s %s: %d %v, want 422 at %s", c.method, c.path, c.body, st, body, c.loc)
		}
		if ta.mgr.called("Dataplane") {
			t.Errorf("%s %s: the sandbox was resolved for a bad request", c.method, c.path)
		}
	}
	// A valid request goes on to the manager, whose refusal is the answer.
	ta := newTestAPI(t, true)
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/dp/id-anns/execute", `{"command":"ls"}`},
		{"POST", "/dp/id-anns/glob", `{"pattern":"*","path":"/"}`},
		{"POST", "/dp/id-anns/grep", `{"pattern":"x","path":"/"}`},
		{"POST", "/dp/id-anns/upload?path=/x", "data"},
		{"GET", "/dp/id-anns/download?path=/x", ""},
		{"GET", "/dp/id-anns/execute/ws", ""},
	} {
		if st, body := ta.do(t, c.method, c.path, memberKey, c.body); st != 404 || detailError(body) != "NotFound" {
			t.Errorf("%s %s: %d %v, want the manager's 404", c.method, c.path, st, body)
		}
	}
}

// TestRegistries: without a registry service the routes answer 404; with
// one they create (201), list, get, patch and delete (204), and validation
// errors from the service keep their field.
func TestRegistries(t *testing.T) {
	ta := newTestAPI(t, true)
	ta.srv.EnableRegistries(nil)
	if st, body := ta.do(t, "GET", "/api/v2/sandboxes/registries", adminKey, nil); st != 404 {
		t.Fatalf("unconfigured registries: %d %v", st, body)
	}
	ta = newTestAPI(t, true)
	ta.srv.enableRegistries(&fakeRegistries{regs: map[string]*store.Registry{}})
	const base = "/api/v2/sandboxes/registries"
	if st, body := ta.do(t, "POST", base, adminKey, `{"name":"r","url":"ghcr.io","username":"u"}`); st != 422 {
		t.Fatalf("create without password: %d %v", st, body)
	}
	if st, body := ta.do(t, "POST", base, adminKey, `{"name":"r","url":"ghcr.io","username":"u","password":"p","token":"t"}`); st != 422 {
		t.Fatalf("create with unknown field: %d %v", st, body)
	}
	if st, body := ta.do(t, "POST", base, adminKey, `{"name":"r","url":"ghcr.io","username":"u","password":"p"}`); st != 201 || field(body, "id") != "r-r" || strings.Contains(fmt.Sprint(body), "\"p\"") {
		t.Fatalf("create: %d %v", st, body)
	}
	if st, body := ta.do(t, "GET", base+"?limit=1", adminKey, nil); st != 200 || field(body, "next_cursor") != nil {
		t.Fatalf("list of the only registry: %d %v", st, body)
	}
	if st, body := ta.do(t, "POST", base, adminKey, `{"name":"r2","url":"ghcr.io","username":"u","password":"p"}`); st != 201 {
		t.Fatalf("create r2: %d %v", st, body)
	}
	if st, body := ta.do(t, "GET", base+"?limit=1", adminKey, nil); st != 200 || field(body, "next_cursor") != "1" {
		t.Fatalf("list with a page after: %d %v", st, body)
	}
	if st, body := ta.do(t, "PATCH", base+"/r", adminKey, `{"url":"quay.io"}`); st != 200 || field(body, "url") != "quay.io" {
		t.Fatalf("patch: %d %v", st, body)
	}
	if st, body := ta.do(t, "GET", base+"/r", adminKey, nil); st != 200 || field(body, "name") != "r" {
		t.Fatalf("get: %d %v", st, body)
	}
	if st, _ := ta.do(t, "DELETE", base+"/r", adminKey, nil); st != 204 {
		t.Fatalf("delete: %d", st)
	}
	if st, _ := ta.do(t, "GET", base+"/r", adminKey, nil); st != 404 {
		t.Fatalf("get after delete: %d", st)
	}
}

// TestStartRestoreMemory: restore_memory reaches the manager from the
// start body or query (unset is nil), and a bad or contradictory value is
// a 422 naming it; the sandbox JSON carries preserve_memory_on_stop.
func TestStartRestoreMemory(t *testing.T) {
	ta := newTestAPI(t, false)
	const start = "/v2/sandboxes/boxes/bobs/start"
	for _, c := range []struct {
		path string
		body any
		want *bool
	}{
		{start, "", nil},
		{start, `{"restore_memory":false}`, ptrTo(false)},
		{start + "?restore_memory=true", nil, ptrTo(true)},
		{start + "?restore_memory=false", `{"restore_memory":false}`, ptrTo(false)},
	} {
		ta.mgr.restore = ptrTo(true) // stale from an earlier start
		st, body := ta.do(t, "POST", c.path, memberKey, c.body)
		got := ta.mgr.restore
		if st != 200 || (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("%s %v: %d %v, manager got restore_memory %v", c.path, c.body, st, body, got)
		}
	}
	for _, c := range []struct {
		path string
		body any
	}{
		{start + "?restore_memory=maybe", nil},
		{start + "?restore_memory=true", `{"restore_memory":false}`},
	} {
		st, body := ta.do(t, "POST", c.path, memberKey, c.body)
		if loc, typ := validation(body); st != 422 || loc != "body/restore_memory" || typ != valueError {
			t.Errorf("%s %v: %d %v, want 422 at restore_memory", c.path, c.body, st, body)
		}
	}
	ta.mgr.sandboxes["bobs"].PreserveMemoryOnStop = true
	if st, body := ta.do(t, "GET", "/v2/sandboxes/boxes/bobs", memberKey, nil); st != 200 || field(body, "preserve_memory_on_stop") != true {
		t.Fatalf("get: %d %v", st, body)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestSandboxJSONSaysDocker: the sandbox JSON carries the docker opt-in.
func TestSandboxJSONSaysDocker(t *testing.T) {
	ta := newTestAPI(t, false)
	for _, want := range []bool{false, true} {
		ta.mgr.sandboxes["bobs"].Docker = want
		if st, body := ta.do(t, "GET", "/v2/sandboxes/boxes/bobs", memberKey, nil); st != 200 || field(body, "docker") != want {
			t.Fatalf("get with docker %v: %d %v", want, st, body)
		}
	}
}

// TestJWKS: the identity public key is served without an API key, in the
// shape the clients' SandboxTokenVerifier reads.
func TestJWKS(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	signer, err := jwtkeys.New(priv, "http://api.test")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(newFakeSandboxes(), fakeAuth{}, &fakeImages{}, "http://api.test/", slog.New(slog.DiscardHandler), WithJWKS(signer))
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/.well-known/jwks.json", nil))
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &set) != nil || len(set.Keys) != 1 {
		t.Fatalf("jwks: %d %s", rec.Code, rec.Body)
	}
	k := set.Keys[0]
	if k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["kid"] != signer.KeyID() || k["x"] != base64.RawURLEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)) {
		t.Fatalf("jwk %v", k)
	}
	if st, _ := newTestAPI(t, false).do(t, "GET", "/.well-known/jwks.json", "", nil); st != 404 {
		t.Fatalf("jwks without WithJWKS: %d, want 404", st)
	}
}

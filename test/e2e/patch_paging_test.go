package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// requestBody is body as a request body: none for nil, a string as is,
// anything else as JSON.
func requestBody(body any) io.Reader {
	switch b := body.(type) {
	case nil:
		return nil
	case string:
		return strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		return bytes.NewReader(j)
	}
}

// p3Do sends a raw request with the test key and extra headers and returns
// the response (body already read) and its body.
func p3Do(t *testing.T, method, url string, body any, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, requestBody(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", testKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, raw
}

// p3Status reads a sandbox's status through the list endpoint, which (unlike
// GET /boxes/{name}) does not count as activity on it.
func p3Status(t *testing.T, d *daemon, name string) (status, msg string, found bool) {
	t.Helper()
	st, body := call(t, d, "GET", "/v2/sandboxes/boxes?name_contains="+name, nil)
	if st != 200 {
		t.Fatalf("list: %d %v", st, body)
	}
	for _, it := range body["sandboxes"].([]any) {
		sb := it.(map[string]any)
		if sb["name"] == name {
			m, _ := sb["status_message"].(string)
			return sb["status"].(string), m, true
		}
	}
	return "", "", false
}

// TestLifecycleAndPatch covers start/stop idempotence, PATCH (rename,
// TTLs, run_config, proxy_config) and create's wait_for_ready modes.
func TestLifecycleAndPatch(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "life3", ref)
	a := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "life-a" })
	newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "life-b" })
	ctx := context.Background()

	t.Run("start and stop", func(t *testing.T) {
		st, body := call(t, d, "POST", "/v2/sandboxes/boxes/life-a/start", map[string]any{})
		if st != 200 || body["status"] != "ready" {
			t.Fatalf("start of a ready sandbox: %d %v, want 200 ready (no-op)", st, body)
		}
		if err := d.Client.WriteFile(ctx, "life-a", "/root/keep.txt", strings.NewReader("kept")); err != nil {
			t.Fatal(err)
		}
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes/life-a/stop", map[string]any{})
		if st != 200 || body["status"] != "stopped" || body["stopped_at"] == nil {
			t.Fatalf("stop: %d %v, want 200 stopped with stopped_at", st, body)
		}
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes/life-a/stop", map[string]any{})
		if st != 200 || body["status"] != "stopped" {
			t.Fatalf("stop of a stopped sandbox: %d %v, want 200 stopped (no-op)", st, body)
		}
		st, body = call(t, d, "GET", "/v2/sandboxes/boxes/life-a/status", nil)
		if st != 200 || body["status"] != "stopped" {
			t.Fatalf("status after stop: %d %v", st, body)
		}
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes/life-a/start", map[string]any{})
		if st != 200 || body["status"] != "ready" || body["stopped_at"] != nil || body["dataplane_url"] != a.DataplaneURL {
			t.Fatalf("start: %d %v, want 200 ready with the same dataplane_url", st, body)
		}
		if out := mustRun(t, d.Client, "life-a", "cat /root/keep.txt"); out != "kept" {
			t.Fatalf("file after stop/start: %q", out)
		}
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes/nope/stop", map[string]any{})
		structured(t, st, 404, body, "NotFound")
	})

	t.Run("rename", func(t *testing.T) {
		st, body := call(t, d, "PATCH", "/v2/sandboxes/boxes/life-a", map[string]any{"name": "life-b"})
		structured(t, st, 409, body, "Conflict")
		st, body = call(t, d, "PATCH", "/v2/sandboxes/boxes/life-a", map[string]any{"name": "bad name"})
		pydantic(t, st, body, "name")
		st, body = call(t, d, "PATCH", "/v2/sandboxes/boxes/life-a", map[string]any{"name": "life-c"})
		if st != 200 || body["name"] != "life-c" || body["id"] != a.ID || body["dataplane_url"] != a.DataplaneURL {
			t.Fatalf("rename: %d %v", st, body)
		}
		st, body = call(t, d, "GET", "/v2/sandboxes/boxes/life-a", nil)
		structured(t, st, 404, body, "NotFound")
		if out := mustRun(t, d.Client, "life-c", "cat /root/keep.txt"); out != "kept" {
			t.Fatalf("renamed sandbox lost its files: %q", out)
		}
		// The OpenAPI docs let DELETE and GET take the id as well.
		st, body = call(t, d, "GET", "/v2/sandboxes/boxes/"+a.ID, nil)
		if st != 200 || body["name"] != "life-c" {
			t.Fatalf("get by id: %d %v", st, body)
		}
	})

	t.Run("ttls and run_config", func(t *testing.T) {
		for _, c := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"idle_ttl_seconds": 61}, "idle_ttl_seconds"},
			{map[string]any{"idle_ttl_seconds": -60}, "idle_ttl_seconds"},
			{map[string]any{"delete_after_stop_seconds": 30}, "delete_after_stop_seconds"},
			{map[string]any{"run_config": map[string]any{"work_dir": "relative/dir"}}, "run_config.work_dir"},
			{map[string]any{"idle_ttl_seconds": "ten"}, "idle_ttl_seconds"},
			{map[string]any{"run_config": "x"}, "run_config"},
			{map[string]any{"proxy_config": []any{1}}, "proxy_config"},
			{map[string]any{"proxy_config": map[string]any{"access_control": map[string]any{"allow_list": []string{"a"}, "deny_list": []string{"b"}}}}, "proxy_config.access_control"},
		} {
			st, body := call(t, d, "PATCH", "/v2/sandboxes/boxes/life-c", c.body)
			pydantic(t, st, body, c.field)
		}
		st, body := call(t, d, "PATCH", "/v2/sandboxes/boxes/life-c", map[string]any{
			"idle_ttl_seconds": 120, "delete_after_stop_seconds": 0,
			"run_config": map[string]any{"work_dir": "/tmp", "env_vars": map[string]string{"PATCHED": "yes"}},
		})
		if st != 200 || body["idle_ttl_seconds"] != 120.0 || body["delete_after_stop_seconds"] != 0.0 {
			t.Fatalf("patch ttls: %d %v", st, body)
		}
		if out := mustRun(t, d.Client, "life-c", "pwd; echo $PATCHED"); out != "/tmp\nyes\n" {
			t.Fatalf("run_config after PATCH: %q", out)
		}
		// An empty body reads the sandbox, like GET.
		st, body = call(t, d, "PATCH", "/v2/sandboxes/boxes/life-c", map[string]any{})
		if st != 200 || body["name"] != "life-c" || body["idle_ttl_seconds"] != 120.0 {
			t.Fatalf("empty patch: %d %v", st, body)
		}
		st, body = call(t, d, "PATCH", "/v2/sandboxes/boxes/nope", map[string]any{"idle_ttl_seconds": 60})
		structured(t, st, 404, body, "NotFound")
		resp, raw := p3Do(t, "PATCH", d.Endpoint+"/v2/sandboxes/boxes/life-c", "[1,2]", nil)
		if resp.StatusCode != 422 {
			t.Fatalf("array body: %d %s, want 422", resp.StatusCode, raw)
		}
	})

	t.Run("proxy_config needs ready", func(t *testing.T) {
		pc := map[string]any{"access_control": map[string]any{"allow_list": []string{"*.example.com"}}}
		st, body := call(t, d, "PATCH", "/v2/sandboxes/boxes/life-c", map[string]any{"proxy_config": pc})
		if st != 200 {
			t.Fatalf("proxy_config on a ready sandbox: %d %v", st, body)
		}
		if err := d.Client.StopSandbox(ctx, "life-c"); err != nil {
			t.Fatal(err)
		}
		st, body = call(t, d, "PATCH", "/v2/sandboxes/boxes/life-c", map[string]any{"proxy_config": pc})
		structured(t, st, 400, body, "InvalidRequest")
		// Other fields of a stopped sandbox can still change.
		st, body = call(t, d, "PATCH", "/v2/sandboxes/boxes/life-c", map[string]any{"idle_ttl_seconds": 0})
		if st != 200 || body["status"] != "stopped" || body["idle_ttl_seconds"] != 0.0 {
			t.Fatalf("patch of a stopped sandbox: %d %v", st, body)
		}
	})

	t.Run("wait_for_ready", func(t *testing.T) {
		start := time.Now()
		st, body := call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": sn.ID, "name": "life-nowait", "wait_for_ready": false})
		if st != 201 || body["status"] != "provisioning" {
			t.Fatalf("wait_for_ready:false: %d %v, want 201 provisioning", st, body)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("wait_for_ready:false blocked for %v", took)
		}
		if sb, err := d.Client.WaitSandbox(ctx, "life-nowait"); err != nil || sb.Status != "ready" {
			t.Fatalf("sandbox never became ready: %+v %v", sb, err)
		}
		// timeout 0 cannot be met: 408, and the boot goes on.
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": sn.ID, "name": "life-408", "wait_for_ready": true, "timeout": 0})
		structured(t, st, 408, body, "Timeout")
		if sb, err := d.Client.WaitSandbox(ctx, "life-408"); err != nil || sb.Status != "ready" {
			t.Fatalf("sandbox after 408 never became ready: %+v %v", sb, err)
		}
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": sn.ID, "timeout": 4000})
		pydantic(t, st, body, "timeout")
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": sn.ID, "wait_for_ready": "yes"})
		pydantic(t, st, body, "wait_for_ready")
	})
}

// TestListPaging checks limit/offset/name_contains and the pagination keys
// of both lists.
func TestListPaging(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "namespace", "")
	for _, n := range []string{"page-a", "page-b", "other-c"} {
		readySnapshot(t, d.Client, n, ref)
	}
	sn := readySnapshot(t, d.Client, "page-boxes", ref)
	for _, n := range []string{"box-1", "box-2"} {
		newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = n })
	}
	names := func(body map[string]any, key string) []string {
		var out []string
		for _, it := range body[key].([]any) {
			out = append(out, it.(map[string]any)["name"].(string))
		}
		return out
	}
	st, body := call(t, d, "GET", "/v2/sandboxes/snapshots?limit=2", nil)
	if st != 200 || strings.Join(names(body, "snapshots"), ",") != "page-a,page-b" || body["next_cursor"] != "2" ||
		strings.Join(names(body, "items"), ",") != "page-a,page-b" || body["offset"] != 0.0 {
		t.Fatalf("first page: %d %v", st, body)
	}
	st, body = call(t, d, "GET", "/v2/sandboxes/snapshots?limit=2&offset=2", nil)
	if st != 200 || strings.Join(names(body, "snapshots"), ",") != "other-c,page-boxes" || body["offset"] != 2.0 {
		t.Fatalf("second page: %d %v", st, body)
	}
	st, body = call(t, d, "GET", "/v2/sandboxes/snapshots?limit=2&offset=4", nil)
	if st != 200 || len(body["snapshots"].([]any)) != 0 || body["next_cursor"] != nil {
		t.Fatalf("past the end: %d %v", st, body)
	}
	st, body = call(t, d, "GET", "/v2/sandboxes/snapshots?name_contains=page-", nil)
	if st != 200 || strings.Join(names(body, "snapshots"), ",") != "page-a,page-b,page-boxes" || body["next_cursor"] != nil {
		t.Fatalf("name_contains: %d %v", st, body)
	}
	st, body = call(t, d, "GET", "/api/v2/sandboxes/boxes?limit=1&offset=0", nil)
	if st != 200 || strings.Join(names(body, "sandboxes"), ",") != "box-1" || body["next_cursor"] != "1" {
		t.Fatalf("boxes first page: %d %v", st, body)
	}
	// The last page, even a full one, has no next_cursor.
	st, body = call(t, d, "GET", "/api/v2/sandboxes/boxes?limit=1&offset=1", nil)
	if st != 200 || strings.Join(names(body, "sandboxes"), ",") != "box-2" || body["next_cursor"] != nil {
		t.Fatalf("boxes page: %d %v", st, body)
	}
	st, body = call(t, d, "GET", "/v2/sandboxes/boxes?name_contains=box-1", nil)
	if st != 200 || strings.Join(names(body, "items"), ",") != "box-1" {
		t.Fatalf("boxes name_contains: %d %v", st, body)
	}
	for _, q := range []string{"limit=0", "limit=501", "limit=x", "offset=-1", "offset=y"} {
		field := strings.SplitN(q, "=", 2)[0]
		for _, p := range []string{"/v2/sandboxes/boxes?", "/v2/sandboxes/snapshots?"} {
			st, body := call(t, d, "GET", p+q, nil)
			pydantic(t, st, body, field)
		}
	}
}

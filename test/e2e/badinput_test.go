package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// call sends a raw API request and decodes the JSON response body.
func call(t *testing.T, d *daemon, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.Endpoint+path, rd)
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

// structured asserts a {"detail":{"error":typ,"message":...}} body.
func structured(t *testing.T, status, wantStatus int, body map[string]any, typ string) {
	t.Helper()
	if status != wantStatus {
		t.Fatalf("status %d, want %d (body %v)", status, wantStatus, body)
	}
	det, ok := body["detail"].(map[string]any)
	if !ok || det["error"] != typ || det["message"] == "" {
		t.Fatalf("body %v is not {detail:{error:%q,message}}", body, typ)
	}
}

// pydantic asserts a 422 {"detail":[{"loc":[...,field],"msg","type":"value_error"}]} body.
func pydantic(t *testing.T, status int, body map[string]any, field string) {
	t.Helper()
	if status != 422 {
		t.Fatalf("status %d, want 422 (body %v)", status, body)
	}
	items, ok := body["detail"].([]any)
	if !ok || len(items) == 0 {
		t.Fatalf("body %v is not a Pydantic array", body)
	}
	it := items[0].(map[string]any)
	loc := it["loc"].([]any)
	if it["type"] != "value_error" || loc[len(loc)-1] != field || it["msg"] == "" {
		t.Fatalf("item %v does not name field %q", it, field)
	}
}

func TestBadInput(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "bad-input", ref)

	t.Run("unauthenticated", func(t *testing.T) {
		resp, err := http.Get(d.Endpoint + "/v2/sandboxes/boxes")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Fatalf("no key: status %d, want 401", resp.StatusCode)
		}
	})
	t.Run("not found", func(t *testing.T) {
		for _, p := range []string{"/v2/sandboxes/boxes/nope", "/api/v2/sandboxes/boxes/nope/status", "/v2/sandboxes/snapshots/00000000-0000-0000-0000-000000000000"} {
			st, body := call(t, d, "GET", p, nil)
			structured(t, st, 404, body, "NotFound")
		}
		st, body := call(t, d, "DELETE", "/v2/sandboxes/boxes/nope", nil)
		structured(t, st, 404, body, "NotFound")
		st, body = call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": "no-such-snapshot"})
		structured(t, st, 404, body, "NotFound")
	})
	t.Run("invalid fields", func(t *testing.T) {
		for _, c := range []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"snapshot_id": sn.ID, "name": "bad name!"}, "name"},
			{map[string]any{"snapshot_id": sn.ID, "name": strings.Repeat("a", 64)}, "name"},
			{map[string]any{"snapshot_id": sn.ID, "mem_bytes": -1}, "mem_bytes"},
			{map[string]any{"snapshot_id": sn.ID, "vcpus": 0}, "vcpus"},
			{map[string]any{"snapshot_id": sn.ID, "vcpus": 100000}, "vcpus"},
			{map[string]any{"snapshot_id": sn.ID, "idle_ttl_seconds": 61}, "idle_ttl_seconds"},
			{map[string]any{"snapshot_id": sn.ID, "run_config": map[string]any{"work_dir": "relative"}}, "run_config.work_dir"},
		} {
			st, body := call(t, d, "POST", "/v2/sandboxes/boxes", c.body)
			pydantic(t, st, body, c.field)
		}
		st, body := call(t, d, "POST", "/v2/sandboxes/snapshots", map[string]any{"name": "../x", "docker_image": ref, "fs_capacity_bytes": 1 << 30})
		pydantic(t, st, body, "name")
		st, body = call(t, d, "POST", "/v2/sandboxes/snapshots", map[string]any{"name": "ok", "docker_image": ref, "fs_capacity_bytes": 0})
		pydantic(t, st, body, "fs_capacity_bytes")
		st, body = call(t, d, "GET", "/v2/sandboxes/boxes?limit=501", nil)
		pydantic(t, st, body, "limit")
	})
	// A misspelt member used to be dropped: {"access_control":{"allowlist"}}
	// booted a sandbox with open egress. Every unknown member, at any depth,
	// is now a 422 naming it, and nothing is created.
	t.Run("unknown fields", func(t *testing.T) {
		for _, c := range []struct {
			body map[string]any
			loc  string
		}{
			{map[string]any{"snapshot_id": sn.ID, "name": "typo-acl", "proxy_config": map[string]any{"access_control": map[string]any{"allowlist": []string{"pypi.org"}}}},
				"proxy_config.access_control.allowlist"},
			{map[string]any{"snapshot_id": sn.ID, "name": "typo-top", "idle_ttl": 60}, "idle_ttl"},
			{map[string]any{"snapshot_id": sn.ID, "name": "typo-rc", "run_config": map[string]any{"workdir": "/"}}, "run_config.workdir"},
		} {
			st, body := call(t, d, "POST", "/v2/sandboxes/boxes", c.body)
			var it map[string]any
			if items, _ := body["detail"].([]any); len(items) > 0 {
				it, _ = items[0].(map[string]any)
			}
			loc, _ := it["loc"].([]any)
			if st != 422 || len(loc) == 0 || loc[len(loc)-1] != c.loc || it["type"] != "extra_forbidden" {
				t.Fatalf("%v: %d %v, want 422 extra_forbidden at %s", c.body, st, body, c.loc)
			}
			if st, _ := call(t, d, "GET", "/v2/sandboxes/boxes/"+c.body["name"].(string), nil); st != 404 {
				t.Fatalf("%s exists after a refused create (%d)", c.body["name"], st)
			}
		}
	})
	t.Run("missing image fails the snapshot", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := d.Client.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "missing", DockerImage: registryHost + "/no/such:image", FSCapacityBytes: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		_, err = d.Client.WaitSnapshot(ctx, s.ID, nil)
		if err == nil {
			t.Fatal("snapshot of a missing image became ready")
		}
		got, err := d.Client.GetSnapshot(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != protocol.SnapshotFailed || !strings.Contains(got.StatusMessage, "no/such") {
			t.Fatalf("snapshot %+v: want failed with a message naming the image", got)
		}
	})
	t.Run("dotdot stays inside", func(t *testing.T) {
		sb := newSandbox(t, d.Client, sn.ID, nil)
		ctx := context.Background()
		if err := d.Client.WriteFile(ctx, sb.Name, "/tmp/../../../../etc/escape-test", strings.NewReader("inside")); err != nil {
			t.Fatal(err)
		}
		if got := mustRun(t, d.Client, sb.Name, "cat /etc/escape-test"); got != "inside" {
			t.Fatalf("file landed elsewhere: %q", got)
		}
		if _, err := os.Stat("/etc/escape-test"); err == nil {
			t.Fatal("a sandbox path with .. wrote to the host's /etc")
		}
		// The sandbox's upper dir lives on the copy-on-write store.
		upper := filepath.Join(d.dataDir, "cow", "sandboxes", strings.ReplaceAll(sb.ID, "-", ""), "upper", "etc", "escape-test")
		if b, err := os.ReadFile(upper); err != nil || string(b) != "inside" {
			t.Fatalf("file not in the sandbox's own upper dir: %v %q", err, b)
		}
		rc, err := d.Client.ReadFile(ctx, sb.Name, "/../../etc/escape-test")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != "inside" {
			t.Fatalf("read back %q", b)
		}
	})
	t.Run("failed create leaves nothing", func(t *testing.T) {
		before := leakCounts(t, d)
		// An image whose /.cubicle is a file cannot mount the agent: the
		// boot fails after storage and network were set up.
		bad := brokenImage(t)
		bsn := readySnapshot(t, d.Client, "broken", bad)
		st, body := call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"snapshot_id": bsn.ID, "name": "broken-box", "timeout": 60})
		if st/100 == 2 {
			t.Fatalf("create on a broken image succeeded: %v", body)
		}
		after := leakCounts(t, d)
		if before != after {
			t.Fatalf("failed create left state behind: before %+v after %+v", before, after)
		}
		sb, err := d.Client.GetSandbox(context.Background(), "broken-box")
		if err != nil || sb.Status != protocol.StatusFailed || sb.StatusMessage == "" {
			t.Fatalf("broken sandbox record: %+v %v (want failed with message)", sb, err)
		}
	})
}

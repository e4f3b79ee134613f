package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// setQuota sets the default workspace's quotas through PUT
// /workspaces/{id}/quotas with the bootstrap (instance admin) key.
func setQuota(t *testing.T, d *daemon, q protocol.Quota) {
	t.Helper()
	if _, err := d.Client.SetQuota(context.Background(), auth.DefaultWorkspace, q); err != nil {
		t.Fatal(err)
	}
}

// postRaw sends a JSON POST with the test key and returns the response,
// for the headers the SDK does not expose.
func postRaw(t *testing.T, url string, body any) (*http.Response, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, strings.NewReader(string(b)))
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, string(out)
}

func want429(t *testing.T, what string, resp *http.Response, body, kind string) {
	t.Helper()
	secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || secs < 1 || !strings.Contains(body, `"error":"QuotaExceeded"`) || !strings.Contains(body, kind+" limit exceeded") {
		t.Fatalf("%s: %d (Retry-After %q) %s; want 429 QuotaExceeded naming %q", what, resp.StatusCode, resp.Header.Get("Retry-After"), body, kind)
	}
}

func sandboxNames(t *testing.T, c *cubicle.Client) []string {
	t.Helper()
	l, err := c.ListSandboxes(context.Background(), cubicle.ListOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sb := range l.Sandboxes {
		names = append(names, sb.Name)
	}
	return names
}

// TestQuotas drives workspace quotas through the real daemon: racing
// creates, a wake over quota, an all-or-nothing fork, and the official
// npm client's reading of each kind of refusal.
func TestQuotas(t *testing.T) {
	ctx := context.Background()
	d := startDaemon(t, "namespace", "")
	c := d.Client
	sn := readySnapshot(t, c, "quota", testImage(t))
	small := func(name string) func(*protocol.CreateSandboxRequest) {
		return func(r *protocol.CreateSandboxRequest) { r.Name, r.VCPUs, r.MemBytes = name, int64p(1), int64p(256<<20) }
	}

	t.Run("concurrent creates", func(t *testing.T) {
		setQuota(t, d, protocol.Quota{MaxSandboxes: int64p(5)})
		var wg sync.WaitGroup
		errs := make([]error, 20)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := protocol.CreateSandboxRequest{SnapshotID: sn.ID, Timeout: int64p(90)}
				small(fmt.Sprintf("race-%d", i))(&req)
				_, errs[i] = c.CreateSandbox(ctx, req)
			}()
		}
		wg.Wait()
		ok, refused := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case cubicle.IsQuotaExceeded(err):
				refused++
			default:
				t.Errorf("create: %v", err)
			}
		}
		if names := sandboxNames(t, c); ok != 5 || refused != 15 || len(names) != 5 {
			t.Fatalf("%d created, %d refused, %d listed; want 5, 15, 5", ok, refused, len(names))
		}
		resp, body := postRaw(t, d.Endpoint+"/v2/sandboxes/boxes", map[string]any{"snapshot_id": sn.ID, "name": "one-more"})
		want429(t, "create at the limit", resp, body, "sandbox count")
		for _, n := range sandboxNames(t, c) {
			if err := c.DeleteSandbox(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
	})

	setQuota(t, d, protocol.Quota{})
	sleepy := newSandbox(t, c, sn.ID, small("sleepy"))
	if err := c.StopSandbox(ctx, "sleepy"); err != nil {
		t.Fatal(err)
	}
	newSandbox(t, c, sn.ID, small("busy"))

	t.Run("wake over quota", func(t *testing.T) {
		setQuota(t, d, protocol.Quota{MaxVCPUs: int64p(1)})
		resp, body := postRaw(t, sleepy.DataplaneURL+"/execute", protocol.ExecuteRequest{Command: "echo hi"})
		want429(t, "exec waking a sandbox over the vCPU quota", resp, body, "cpu")
		if got, err := c.GetSandbox(ctx, "sleepy"); err != nil || got.Status != protocol.StatusStopped {
			t.Fatalf("after a refused wake: %+v, %v; want it stopped", got, err)
		}
		setQuota(t, d, protocol.Quota{MaxVCPUs: int64p(2)})
		if res, err := c.Run(ctx, "sleepy", "echo hi"); err != nil || res.Stdout != "hi\n" {
			t.Fatalf("exec waking within quota: %+v, %v", res, err)
		}
		if err := c.StopSandbox(ctx, "sleepy"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("fork over quota", func(t *testing.T) {
		before, err := c.ListSnapshots(ctx, cubicle.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		setQuota(t, d, protocol.Quota{MaxSandboxes: int64p(5)})
		resp, body := postRaw(t, d.Endpoint+"/v2/sandboxes/boxes/busy/fork", map[string]any{"count": 10})
		want429(t, "fork of 10 with room for 3", resp, body, "sandbox count")
		after, err := c.ListSnapshots(ctx, cubicle.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if names := sandboxNames(t, c); len(names) != 2 || len(after.Snapshots) != len(before.Snapshots) {
			t.Fatalf("a refused fork left %v and %d → %d snapshots", names, len(before.Snapshots), len(after.Snapshots))
		}
	})

	t.Run("official client", func(t *testing.T) {
		dir := npmDir(t, false)
		script, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "e2e", "testdata", "quota-client.mjs"))
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, "quota-client.mjs")
		if err := os.WriteFile(dst, script, 0o644); err != nil {
			t.Fatal(err)
		}
		// The workspace holds sleepy (stopped) and busy (running), each
		// 1 vCPU, 256 MiB and 1 GiB of declared storage.
		for _, tc := range []struct {
			expect string
			q      protocol.Quota
			create string
			start  string
		}{
			{"sandbox_count", protocol.Quota{MaxSandboxes: int64p(2)}, `{"vCpus":1,"memBytes":268435456}`, ""},
			{"cpu", protocol.Quota{MaxVCPUs: int64p(1)}, `{"vCpus":1,"memBytes":268435456}`, "sleepy"},
			{"memory", protocol.Quota{MaxMemBytes: int64p(256 << 20)}, `{"vCpus":1,"memBytes":268435456}`, "sleepy"},
			{"storage", protocol.Quota{MaxStorageBytes: int64p(2 << 30)}, `{"vCpus":1,"memBytes":268435456,"fsCapacityBytes":1073741824}`, ""},
		} {
			t.Run(tc.expect, func(t *testing.T) {
				setQuota(t, d, tc.q)
				ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(ctx, "node", dst)
				cmd.Dir = dir
				cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+d.Endpoint, "LANGSMITH_API_KEY="+testKey,
					"QUOTA_SNAPSHOT="+sn.ID, "QUOTA_CREATE="+tc.create, "QUOTA_EXPECT="+tc.expect, "QUOTA_START="+tc.start)
				out, err := cmd.CombinedOutput()
				t.Logf("%s", out)
				if err != nil || !strings.Contains(string(out), "QUOTA CLIENT PASSED") {
					t.Fatalf("official client over the %s quota: %v", tc.expect, err)
				}
			})
		}
		if names := sandboxNames(t, c); len(names) != 2 {
			t.Fatalf("refused creates left sandboxes: %v", names)
		}
	})
}

// TestRateLimit: with --rate-limit 1 --rate-burst 3 a key gets three
// requests at once, then a 429 RateLimited with Retry-After; another key
// keeps its own bucket.
func TestRateLimit(t *testing.T) {
	d := startDaemonArgs(t, "namespace", "", "--rate-limit", "1", "--rate-burst", "3")
	other := memberKey(t, d, "rl-other")
	get := func(key string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", d.Endpoint+"/v2/sandboxes/boxes", nil)
		req.Header.Set("X-Api-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for i := range 3 {
		if resp, body := get(testKey); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := get(testKey)
	secs, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	if resp.StatusCode != http.StatusTooManyRequests || secs < 1 || !strings.Contains(body, `"error":"RateLimited"`) {
		t.Fatalf("over the burst: %d (Retry-After %q) %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if resp, body := get(other); resp.StatusCode != http.StatusOK {
		t.Fatalf("another key: %d %s", resp.StatusCode, body)
	}
	time.Sleep(time.Duration(secs) * time.Second)
	if resp, body := get(testKey); resp.StatusCode != http.StatusOK {
		t.Fatalf("after Retry-After: %d %s", resp.StatusCode, body)
	}
}

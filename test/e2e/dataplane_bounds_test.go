package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Daemon memory bounds for the attacks below (growth of the daemon's peak
// RSS, VmHWM, over one attack). The daemon holds at most
// api.DefaultExecOutputLimit per stream for an HTTP execute and one match
// at a time of a search; the rest is Go heap slack. Before the bounds the
// 512 MiB execute took the daemon to 2.9 GB and the 40k-path glob to 943 MB.
const (
	execRSSBound = 128 << 20
	globRSSBound = 32 << 20
)

// daemonMem is field (VmRSS, VmHWM, …) of the daemon's /proc status, in
// bytes.
func daemonMem(t *testing.T, d *daemon, field string) int64 {
	t.Helper()
	n, err := procBytes(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid), field)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// procBytes reads the "field: N kB" line of a /proc file (status,
// meminfo, smaps_rollup) as bytes.
func procBytes(path, field string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %s: %w", path, field, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no %s in %s", field, path)
}

// TestExecOutputBounded: a command printing 512 MiB through the HTTP
// execute (the official client's path without `ws`) costs the daemon at
// most execRSSBound, and the answer keeps the first 16 MiB of stdout,
// marked truncated, with the exit code and the full byte count.
func TestExecOutputBounded(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "bounds", ref)
			sb := newSandbox(t, d.Client, sn.ID, nil)
			before := daemonMem(t, d, "VmHWM")
			const total = 512 << 20
			resp, raw := p3Do(t, "POST", sb.DataplaneURL+"/execute", map[string]any{"shell": "/bin/sh", "timeout": 120,
				"command": fmt.Sprintf("head -c %d /dev/zero | tr '\\0' a; echo err >&2; exit 3", total)}, nil)
			growth := daemonMem(t, d, "VmHWM") - before
			var res protocol.ExecuteResult
			if err := json.Unmarshal(raw, &res); resp.StatusCode != 200 || err != nil {
				t.Fatalf("execute: %d %v %.200s", resp.StatusCode, err, raw)
			}
			t.Logf("%s: 512 MiB of stdout: daemon peak RSS +%d MiB, answer %d bytes", rt, growth>>20, len(raw))
			if len(res.Stdout) != api.DefaultExecOutputLimit || strings.Trim(res.Stdout, "a") != "" || !res.StdoutTruncated || res.StdoutBytes != total {
				t.Fatalf("stdout: %d bytes, truncated %v, stdout_bytes %d", len(res.Stdout), res.StdoutTruncated, res.StdoutBytes)
			}
			if res.Stderr != "err\n" || res.StderrTruncated || res.ExitCode != 3 {
				t.Fatalf("stderr %q truncated %v exit %d", res.Stderr, res.StderrTruncated, res.ExitCode)
			}
			if growth > execRSSBound {
				t.Fatalf("daemon peak RSS grew %d MiB, bound %d MiB", growth>>20, execRSSBound>>20)
			}
			// Small output is whole and carries no marker.
			resp, raw = p3Do(t, "POST", sb.DataplaneURL+"/execute", map[string]any{"shell": "/bin/sh", "command": "echo hi"}, nil)
			if resp.StatusCode != 200 || string(raw) != `{"stdout":"hi\n","stderr":"","exit_code":0,"stdout_bytes":3}`+"\n" {
				t.Fatalf("small execute: %d %s", resp.StatusCode, raw)
			}
			resp, raw = p3Do(t, "POST", sb.DataplaneURL+"/execute", map[string]any{"command": strings.Repeat("x", 2<<20)}, nil)
			if resp.StatusCode != 413 {
				t.Fatalf("execute with a 2 MiB body: %d %s, want 413", resp.StatusCode, raw)
			}
		})
	}
}

// TestGlobBounded: a glob over 40k paths of ~4 KB each (160 MB of JSON)
// answers at most agent.MaxSearchBytes, marked truncated, and costs the
// daemon at most globRSSBound.
func TestGlobBounded(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			// The audit record's scan of the 40k files (bounded on its own:
			// storage TestTrackerTooManyChanges) would overlap the glob.
			d := startDaemonArgs(t, rt, "", "--audit-files=false")
			sn := readySnapshot(t, d.Client, "bounds", ref)
			sb := newSandbox(t, d.Client, sn.ID, nil)
			// 16 nested directories of 240 characters, then 40000 files.
			seg := strings.Repeat("d", 240)
			deep := "/data/" + strings.TrimSuffix(strings.Repeat(seg+"/", 16), "/")
			mustRun(t, d.Client, sb.Name, fmt.Sprintf("mkdir -p %s && cd %s && seq 1 40000 | xargs touch && ls | wc -l", deep, deep))
			before := daemonMem(t, d, "VmHWM")
			resp, raw := p3Do(t, "POST", sb.DataplaneURL+"/glob", map[string]any{"pattern": "**", "path": "/data", "limit": 100000}, nil)
			growth := daemonMem(t, d, "VmHWM") - before
			var g agent.GlobResult
			if err := json.Unmarshal(raw, &g); resp.StatusCode != 200 || err != nil {
				t.Fatalf("glob: %d %v %.200s", resp.StatusCode, err, raw)
			}
			t.Logf("%s: glob of 40k long paths: %d matches, %d bytes, daemon peak RSS +%d MiB", rt, len(g.Matches), len(raw), growth>>20)
			if !g.Truncated || len(g.Matches) < 1000 || len(raw) > agent.MaxSearchBytes+(1<<20) {
				t.Fatalf("glob: truncated %v, %d matches, %d bytes", g.Truncated, len(g.Matches), len(raw))
			}
			if growth > globRSSBound {
				t.Fatalf("daemon peak RSS grew %d MiB, bound %d MiB", growth>>20, globRSSBound>>20)
			}
		})
	}
}

// TestFileAPIActsAsUser: with run_config.user app, the file API has app's
// rights: app's symlink to /etc cannot make an upload overwrite
// /etc/shadow, app cannot read it, and uploads are owned by app. Kernel
// pseudo-files are a 400, not a 500.
func TestFileAPIActsAsUser(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "asuser", ref)
			sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) {
				r.RunConfig = &protocol.RunConfig{User: "app"}
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			asRoot := func(cmd string) string {
				res, err := d.Client.RunRequest(ctx, sb.Name, protocol.ExecuteRequest{Command: cmd, Shell: "/bin/sh", RunConfig: &protocol.RunConfig{User: "0"}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%q as root: %+v %v", cmd, res, err)
				}
				return res.Stdout
			}
			asRoot("echo root:secret > /etc/shadow && chmod 640 /etc/shadow")
			// The sandbox's user plants the links.
			mustRun(t, d.Client, sb.Name, "test $(id -u) = 1000 && ln -s /etc /home/app/x && ln -s /etc/shadow /home/app/y")
			dp := sb.DataplaneURL
			upload := func(p, body string) (int, string) {
				resp, raw := p3Do(t, "POST", dp+"/upload?path="+url.QueryEscape(p), body, map[string]string{"Content-Type": "application/octet-stream"})
				return resp.StatusCode, string(raw)
			}
			download := func(p string) (int, string) {
				resp, raw := p3Do(t, "GET", dp+"/download?path="+url.QueryEscape(p), nil, nil)
				return resp.StatusCode, string(raw)
			}
			if st, body := upload("/home/app/x/shadow", "pwned"); st != 403 {
				t.Fatalf("upload through app's link to /etc: %d %s", st, body)
			}
			if st, body := upload("/etc/shadow", "pwned"); st != 403 {
				t.Fatalf("upload to /etc/shadow as app: %d %s", st, body)
			}
			if got := asRoot("cat /etc/shadow"); got != "root:secret\n" {
				t.Fatalf("/etc/shadow changed: %q", got)
			}
			if st, body := download("/home/app/y"); st != 403 {
				t.Fatalf("download through app's link to /etc/shadow: %d %s", st, body)
			}
			if st, body := download("/etc/shadow"); st != 403 {
				t.Fatalf("download of /etc/shadow as app: %d %s", st, body)
			}
			if st, body := upload("/home/app/new/f.txt", "mine"); st != 200 {
				t.Fatalf("upload into app's home: %d %s", st, body)
			}
			if got := asRoot("stat -c %u:%g /home/app/new /home/app/new/f.txt"); got != "1000:1000\n1000:1000\n" {
				t.Fatalf("owners of uploaded dir and file: %q", got)
			}
			if st, body := download("/home/app/new/f.txt"); st != 200 || body != "mine" {
				t.Fatalf("download of app's file: %d %q", st, body)
			}
			for _, p := range []string{"/proc/self/mountinfo", "/proc/1/status", "/dev/null"} {
				if st, body := download(p); st != 400 || !strings.Contains(body, "not a regular file") {
					t.Fatalf("download %s: %d %s, want 400", p, st, body)
				}
			}
			if st, body := download("/no/such"); st != 404 {
				t.Fatalf("download of a missing file: %d %s", st, body)
			}
			if st, body := download("/home/app"); st != 400 {
				t.Fatalf("download of a directory: %d %s", st, body)
			}
		})
	}
}

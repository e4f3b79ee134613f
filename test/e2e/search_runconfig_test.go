package e2e

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestGlobGrepAndRanges checks glob and grep relayed to the agent and the
// download's conditional and range answers through the daemon.
func TestGlobGrepAndRanges(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "dp3", ref)
	sb := newSandbox(t, d.Client, sn.ID, nil)
	mustRun(t, d.Client, sb.Name, `mkdir -p /data/a/b && printf 'one\nneedle here\n' > /data/a/x.txt && printf 'needle\n' > /data/a/b/y.txt && echo no > /data/z.log && printf 0123456789 > /data/digits`)
	dp := sb.DataplaneURL

	resp, raw := p3Do(t, "POST", dp+"/glob", map[string]any{"pattern": "**/*.txt", "path": "/data"}, nil)
	var g struct {
		Matches []struct {
			Path      string `json:"path"`
			IsDir     bool   `json:"is_dir"`
			SizeBytes int64  `json:"size_bytes"`
		} `json:"matches"`
		Truncated bool `json:"truncated"`
	}
	if err := json.Unmarshal(raw, &g); resp.StatusCode != 200 || err != nil {
		t.Fatalf("glob: %d %s", resp.StatusCode, raw)
	}
	var paths []string
	for _, m := range g.Matches {
		paths = append(paths, m.Path)
	}
	if strings.Join(paths, ",") != "/data/a/b/y.txt,/data/a/x.txt" && strings.Join(paths, ",") != "/data/a/x.txt,/data/a/b/y.txt" {
		t.Fatalf("glob matches %v", paths)
	}
	resp, raw = p3Do(t, "POST", dp+"/glob", map[string]any{"pattern": "*", "path": "/data", "limit": 1}, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `"truncated":true`) {
		t.Fatalf("glob limit 1: %d %s", resp.StatusCode, raw)
	}
	resp, raw = p3Do(t, "POST", dp+"/grep", map[string]any{"pattern": "needle", "path": "/data", "glob": "*.txt"}, nil)
	if resp.StatusCode != 200 || !strings.Contains(string(raw), `{"path":"/data/a/x.txt","line":2,"text":"needle here"}`) ||
		!strings.Contains(string(raw), `{"path":"/data/a/b/y.txt","line":1,"text":"needle"}`) || strings.Contains(string(raw), "z.log") {
		t.Fatalf("grep: %d %s", resp.StatusCode, raw)
	}
	resp, raw = p3Do(t, "POST", dp+"/glob", map[string]any{"pattern": "*", "path": "/no/such"}, nil)
	if resp.StatusCode != 404 || !strings.Contains(string(raw), "FileNotFound") {
		t.Fatalf("glob of a missing path: %d %s", resp.StatusCode, raw)
	}
	st, body := call(t, d, "POST", strings.TrimPrefix(dp, d.Endpoint)+"/grep", map[string]any{"path": "/data"})
	pydantic(t, st, body, "pattern")
	st, body = call(t, d, "POST", strings.TrimPrefix(dp, d.Endpoint)+"/glob", map[string]any{"pattern": "*", "path": "rel"})
	pydantic(t, st, body, "path")
	st, body = call(t, d, "POST", strings.TrimPrefix(dp, d.Endpoint)+"/glob", map[string]any{"pattern": "*", "limit": -1})
	pydantic(t, st, body, "limit")

	file := dp + "/download?path=/data/digits"
	resp, _ = p3Do(t, "HEAD", file, nil, nil)
	etag := resp.Header.Get("ETag")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Length") != "10" || etag == "" || strings.HasPrefix(etag, "W/") {
		t.Fatalf("HEAD: %d %v", resp.StatusCode, resp.Header)
	}
	for _, c := range []struct {
		hdr         map[string]string
		status      int
		body, crng  string
		description string
	}{
		{map[string]string{"Range": "bytes=2-5"}, 206, "2345", "bytes 2-5/10", "range"},
		{map[string]string{"Range": "bytes=7-1000"}, 206, "789", "bytes 7-9/10", "end clamped"},
		{map[string]string{"Range": "bytes=-3"}, 206, "789", "bytes 7-9/10", "suffix"},
		{map[string]string{"Range": "bytes=100-"}, 416, "", "bytes */10", "start past EOF"},
		{map[string]string{"If-None-Match": etag}, 304, "", "", "unchanged"},
		{map[string]string{"Range": "bytes=0-1", "If-Range": `"stale"`}, 200, "0123456789", "", "stale If-Range"},
	} {
		resp, raw := p3Do(t, "GET", file, nil, c.hdr)
		if resp.StatusCode != c.status || resp.Header.Get("Content-Range") != c.crng || (c.status != 416 && string(raw) != c.body) {
			t.Fatalf("%s: %d %q Content-Range %q; want %d %q %q", c.description, resp.StatusCode, raw, resp.Header.Get("Content-Range"), c.status, c.body, c.crng)
		}
	}
}

// TestRunConfigLayers proves each run_config layer (spec §4.3): image →
// snapshot → sandbox → command, with user and work_dir replacing and
// env_vars merging, including a switch to uid 1000 (user "app").
func TestRunConfigLayers(t *testing.T) {
	testImage(t) // starts the shared registry
	base := imagetest.BusyboxImage(t)
	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.Env = append(cfg.Env, "IMG=1", "LAYER=image")
	cfg.WorkingDir = "/root"
	layered, err := mutate.Config(base, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := imagetest.Push(t, registryHost, "cubicle/runconfig:e2e", layered)

	d := startDaemon(t, "namespace", "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sn, err := d.Client.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "rc", DockerImage: ref, FSCapacityBytes: 1 << 30,
		RunConfig: &protocol.RunConfig{WorkDir: "/tmp", EnvVars: map[string]string{"SNAP": "1", "LAYER": "snapshot"}}})
	if err != nil {
		t.Fatal(err)
	}
	if sn, err = d.Client.WaitSnapshot(ctx, sn.ID, nil); err != nil {
		t.Fatal(err)
	}
	if rc := sn.RunConfig; rc == nil || rc.WorkDir != "/tmp" || rc.EnvVars["IMG"] != "1" || rc.EnvVars["LAYER"] != "snapshot" {
		t.Fatalf("snapshot run_config %+v: want image's env under the snapshot's", sn.RunConfig)
	}
	const probe = `echo "$(id -u) $(pwd) img=$IMG snap=$SNAP box=$BOX layer=$LAYER"`
	exec := func(name string, rc *protocol.RunConfig) string {
		res, err := d.Client.RunRequest(ctx, name, protocol.ExecuteRequest{Command: probe, Shell: "/bin/sh", RunConfig: rc})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v %v", res, err)
		}
		return res.Stdout
	}

	plain := newSandbox(t, d.Client, sn.ID, nil)
	if got := exec(plain.Name, nil); got != "0 /tmp img=1 snap=1 box= layer=snapshot\n" {
		t.Fatalf("image+snapshot layers: %q", got)
	}
	box := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.RunConfig = &protocol.RunConfig{User: "app", EnvVars: map[string]string{"BOX": "1", "LAYER": "sandbox"}}
	})
	if got := exec(box.Name, nil); got != "1000 /tmp img=1 snap=1 box=1 layer=sandbox\n" {
		t.Fatalf("sandbox layer (user app): %q", got)
	}
	if got := exec(box.Name, &protocol.RunConfig{WorkDir: "/", EnvVars: map[string]string{"LAYER": "command"}}); got != "1000 / img=1 snap=1 box=1 layer=command\n" {
		t.Fatalf("command layer: %q", got)
	}
	if got := exec(box.Name, &protocol.RunConfig{User: "0"}); got != "0 /tmp img=1 snap=1 box=1 layer=sandbox\n" {
		t.Fatalf("command user 0: %q", got)
	}
	if got := exec(box.Name, &protocol.RunConfig{User: "1000:1000"}); !strings.HasPrefix(got, "1000 ") {
		t.Fatalf("command uid:gid: %q", got)
	}
	// A file written as app is owned by app.
	mustRun(t, d.Client, box.Name, "touch /tmp/owned")
	res, err := d.Client.RunRequest(ctx, box.Name, protocol.ExecuteRequest{Command: "stat -c %u /tmp/owned", Shell: "/bin/sh"})
	if err != nil || res.Stdout != "1000\n" {
		t.Fatalf("owner of a file made by the sandbox's user: %+v %v", res, err)
	}
	// The deprecated env/cwd must not be combined with run_config.
	resp, raw := p3Do(t, "POST", box.DataplaneURL+"/execute", map[string]any{"command": "true", "cwd": "/", "run_config": map[string]any{"user": "0"}}, nil)
	if resp.StatusCode != 422 || !strings.Contains(string(raw), "run_config") {
		t.Fatalf("run_config with cwd: %d %s", resp.StatusCode, raw)
	}
}

// TestRelativeFilePaths: a relative file-API path (`write("data.txt")`,
// `read("out/x.json")`) resolves where a command starts: the user's home
// without a work_dir, the sandbox's run_config.work_dir with one; so a
// command sees the file under the same relative name.
func TestRelativeFilePaths(t *testing.T) {
	testImage(t) // starts the shared registry
	base := imagetest.BusyboxImage(t)
	cf, err := base.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cf.Config
	cfg.WorkingDir = "" // commands start in the user's home
	noWorkDir, err := mutate.Config(base, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ref := imagetest.Push(t, registryHost, "cubicle/noworkdir:e2e", noWorkDir)
	d := startDaemon(t, "namespace", "")
	sn := readySnapshot(t, d.Client, "relpaths", ref)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	roundTrip := func(name, rel, content string) {
		t.Helper()
		if err := d.Client.WriteFile(ctx, name, rel, strings.NewReader(content)); err != nil {
			t.Fatalf("write %q: %v", rel, err)
		}
		rc, err := d.Client.ReadFile(ctx, name, rel)
		if err != nil {
			t.Fatalf("read %q: %v", rel, err)
		}
		defer rc.Close()
		if b, err := io.ReadAll(rc); err != nil || string(b) != content {
			t.Fatalf("read %q = %q, %v; want %q", rel, b, err, content)
		}
	}
	home := newSandbox(t, d.Client, sn.ID, nil)
	mustRun(t, d.Client, home.Name, "mkdir -p /root") // busybox has no home for root
	roundTrip(home.Name, "data.txt", "in home\n")
	if out := mustRun(t, d.Client, home.Name, "cat /root/data.txt && cat data.txt && pwd"); out != "in home\nin home\n/root\n" {
		t.Fatalf("a relative upload without a work_dir: %q; want it in root's home, where commands start", out)
	}
	wd := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.RunConfig = &protocol.RunConfig{WorkDir: "/srv/app"}
	})
	roundTrip(wd.Name, "out/x.json", `{"ok":true}`)
	if out := mustRun(t, d.Client, wd.Name, "cat /srv/app/out/x.json; echo; pwd"); out != "{\"ok\":true}\n/srv/app\n" {
		t.Fatalf("a relative upload with work_dir /srv/app: %q", out)
	}
}

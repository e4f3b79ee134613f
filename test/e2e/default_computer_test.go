package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/blueprint"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// blueprintCache is where e2e daemons keep the default computer's
// downloaded packages, outside any test's data dir so a rerun (and the
// next CI run on the same machine) starts from a warm cache.
func blueprintCache() string {
	if d := os.Getenv("CUBICLE_BLUEPRINT_CACHE"); d != "" {
		return d
	}
	return "/var/cache/cubicle-e2e/blueprint"
}

// TestDefaultComputer: a daemon started with no --default-image builds
// the built-in snapshot "default" from Debian's packages in the
// background — listed as building with progress, a create that needs it
// meanwhile answered 503 NotReady with Retry-After — and then a sandbox
// created without naming a snapshot has the tools the default computer
// promises, as "user" with sudo; the official npm client's
// sandbox.run("python my_analysis.py") works on it; a restart keeps it.
func TestDefaultComputer(t *testing.T) {
	// The build itself is under test: its finished tarball from an earlier
	// run is dropped from the built cache (the downloads stay), and this
	// build's is kept there for the docker and builder blueprints stacked
	// on it.
	builtEntry := filepath.Join(blueprintCache(), "built", blueprint.Default().Key())
	for _, ext := range []string{".json", ".tar"} {
		if err := os.Remove(builtEntry + ext); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	d := startDaemonEnv(t, "gvisor", "", []string{"CUBICLE_DEFAULT_IMAGE=", "CUBICLE_BLUEPRINT_CACHE=" + blueprintCache()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	sn := builtinDefault(t, d.Client)
	if sn.Status != protocol.SnapshotBuilding {
		t.Fatalf("right after start, default is %s, want building", sn.Status)
	}
	status, retry, body := createRaw(t, d, `{"wait_for_ready":false}`)
	if status != http.StatusServiceUnavailable || retry == "" || !strings.Contains(body, "NotReady") {
		t.Fatalf("create while default builds: %d Retry-After=%q %s; want 503 NotReady with Retry-After", status, retry, body)
	}

	start := time.Now()
	var seen []string
	for sn.Status == protocol.SnapshotBuilding {
		if time.Since(start) > 8*time.Minute {
			t.Fatalf("default still building after %s (at %d%%: %s)", time.Since(start), sn.BuildPercent, sn.BuildStep)
		}
		if sn.BuildStep != "" && (len(seen) == 0 || seen[len(seen)-1] != sn.BuildStep) {
			seen = append(seen, sn.BuildStep)
		}
		time.Sleep(time.Second)
		sn = builtinDefault(t, d.Client)
	}
	t.Logf("default built in %s; %d progress steps seen, e.g. %q", time.Since(start).Round(time.Second), len(seen), seen[:min(len(seen), 3)])
	if sn.Status != protocol.SnapshotReady {
		t.Fatalf("default is %s: %s", sn.Status, sn.StatusMessage)
	}
	for _, line := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(line, `msg="built blueprint"`) {
			t.Logf("daemon: %s", line) // the build's own time, without the import
		}
	}
	if len(seen) < 3 {
		t.Errorf("progress steps seen while building: %q, want several", seen)
	}
	if _, err := os.Stat(builtEntry + ".json"); err != nil {
		t.Errorf("the build is not in the built cache: %v", err)
	}
	full, err := d.Client.GetSnapshot(ctx, sn.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"python3", "python-is-python3", "nodejs", "npm", "git", "gcc", "procps", "sudo"} {
		if full.Packages[p] == "" {
			t.Errorf("packages of default lack %s (have %d packages)", p, len(full.Packages))
		}
	}
	if err := d.Client.DeleteSnapshot(ctx, sn.ID); err == nil {
		t.Errorf("deleting the built-in default succeeded; want it refused")
	}

	sb, err := d.Client.CreateSandbox(ctx, protocol.CreateSandboxRequest{Timeout: int64p(90)})
	if err != nil {
		t.Fatalf("create from default: %v", err)
	}
	if sb.SnapshotID != sn.ID {
		t.Fatalf("sandbox booted snapshot %s, want the built-in %s", sb.SnapshotID, sn.ID)
	}
	for _, cmd := range []string{
		`python -c 'import sys; print(sys.version_info[0])'`,
		`python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'print(1)'`,
		`pip --version`,
		`node -e 'console.log(6*7)'`,
		`npm --version`,
		`git --version`,
		`gcc --version`,
		`top -b -n1 | head -5`,
		`test "$(id -un)" = user && test "$PWD" = /home/user && sudo -n true && test "$(sudo -n id -u)" = 0`,
		`locale | grep -q 'LANG=C.UTF-8' && python -c 'print("\u00e9")'`,
		`jq --version && unzip -v >/dev/null && less --version >/dev/null && wget --version >/dev/null && curl --version >/dev/null`,
		// The build's dpkg ran without fsync; the image's does not.
		`! grep -rqs unsafe-io /etc/dpkg/dpkg.cfg /etc/dpkg/dpkg.cfg.d`,
	} {
		mustRun(t, d.Client, sb.Name, cmd)
	}

	out := officialClientRun(t, d)
	if !strings.Contains(out, `"exit_code":0`) || !strings.Contains(out, `mean=2.5`) {
		t.Fatalf("official client: %s", out)
	}

	// A restart finds it ready (nothing rebuilt, its unnamed layers kept
	// by the start's image GC) and the sandbox on it running.
	d.stop()
	d.restart()
	if again := builtinDefault(t, d.Client); again.ID != sn.ID || again.Status != protocol.SnapshotReady {
		t.Fatalf("after a restart default is %s %s, want %s ready", again.ID, again.Status, sn.ID)
	}
	mustRun(t, d.Client, sb.Name, `python -c 'print(1)'`)
	fresh, err := d.Client.CreateSandbox(ctx, protocol.CreateSandboxRequest{Timeout: int64p(90)})
	if err != nil {
		t.Fatalf("create from default after a restart: %v", err)
	}
	mustRun(t, d.Client, fresh.Name, `node -e 'process.exit(0)'`)
}

// builtinDefault finds the built-in "default" in the snapshot list.
func builtinDefault(t testing.TB, c *cubicle.Client) protocol.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := c.ListSnapshots(ctx, cubicle.ListOptions{Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	for _, sn := range l.Snapshots {
		if sn.Name == "default" && sn.Builtin {
			return sn
		}
	}
	t.Fatalf("no built-in default among %d snapshots", len(l.Snapshots))
	return protocol.Snapshot{}
}

// createRaw posts a sandbox create body and returns the status, the
// Retry-After header and the body.
func createRaw(t *testing.T, d *daemon, body string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, d.Endpoint+"/v2/sandboxes/boxes", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), b.String()
}

// analysisScript is the README's first example with the official client:
// a sandbox from the default snapshot, a Python file written, then run.
const analysisScript = `import { SandboxClient } from "langsmith/sandbox";
const client = new SandboxClient();
const sandbox = await client.createSandbox({ timeout: 120 });
try {
  await sandbox.write("/home/user/my_analysis.py", "import statistics\nprint(f'mean={statistics.mean([1, 2, 3, 4])}')\n");
  const res = await sandbox.run("python my_analysis.py");
  console.log(JSON.stringify(res));
} finally {
  await sandbox.delete();
}
`

// officialClientRun runs analysisScript against d and returns its output.
func officialClientRun(t *testing.T, d *daemon) string {
	dir := npmDirVersion(t, clientVersions[len(clientVersions)-1], true)
	dst := filepath.Join(dir, "default-computer.mjs")
	if err := os.WriteFile(dst, []byte(analysisScript), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+d.Endpoint, "LANGSMITH_API_KEY="+testKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("official client: %v\n%s", err, out)
	}
	return string(out)
}

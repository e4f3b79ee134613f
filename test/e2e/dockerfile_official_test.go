package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// officialDockerfileScript builds a snapshot with the official client's
// createSnapshotFromDockerfile (its builder sandbox, buildkitd and
// buildctl inside, capture with docker_image) and runs the built program
// in a sandbox from it. argv: context dir.
const officialDockerfileScript = `
import { SandboxClient } from "langsmith/sandbox";
const client = new SandboxClient();
const t0 = Date.now();
const snap = await client.createSnapshotFromDockerfile("from-dockerfile", "Dockerfile", {
  context: process.argv[2], timeout: 900, onBuildLog: (s) => process.stderr.write(s),
});
console.log("SNAPSHOT " + JSON.stringify({ status: snap.status, id: snap.id, ms: Date.now() - t0 }));
const t1 = Date.now(); // the builder snapshot is made now
const again = await client.createSnapshotFromDockerfile("from-dockerfile-2", "Dockerfile", { context: process.argv[2], timeout: 300 });
console.log("AGAIN " + JSON.stringify({ status: again.status, ms: Date.now() - t1 }));
const sb = await client.createSandbox(snap.id, { timeout: 120 });
try {
  const res = await sb.run("/bin/cat /greeting && /bin/ls /bin/sh", { shell: "/bin/sh" });
  console.log("RUN " + JSON.stringify(res));
} finally {
  await sb.delete();
}
`

// TestOfficialDockerfileSnapshot: the official npm client's
// createSnapshotFromDockerfile works unmodified: its builder sandbox
// boots the built-in builder (made at this first use), BuildKit builds a
// Dockerfile with COPY and RUN steps into the builder's Docker, capture
// with docker_image exports it into a snapshot, and a sandbox from that
// snapshot runs what the build made; a second build reuses the builder
// snapshot. No builder sandbox is left.
func TestOfficialDockerfileSnapshot(t *testing.T) {
	d := startDaemonArgs(t, "gvisor", "", "--blueprint-cache", blueprintCache())
	dir := npmDirVersion(t, "0.12", true)
	script := filepath.Join(dir, "dockerfile-official.mjs")
	if err := os.WriteFile(script, []byte(officialDockerfileScript), 0o644); err != nil {
		t.Fatal(err)
	}
	bctx := t.TempDir()
	bb, err := os.ReadFile(imagetest.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string]string{
		"busybox": string(bb),
		"Dockerfile": "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n" +
			"RUN echo built-by-buildkit > /greeting\nCMD [\"/bin/cat\", \"/greeting\"]\n",
	} {
		if err := os.WriteFile(filepath.Join(bctx, name), []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "node", script, bctx)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+d.Endpoint, "LANGSMITH_API_KEY="+testKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("official client: %v\n%s\ndaemon:\n%s", err, out, d.logs.String())
	}
	t.Logf("createSnapshotFromDockerfile and a run from it: %s (builder blueprint build included)", time.Since(start).Round(time.Second))
	var snap struct {
		Status string `json:"status"`
		ID     string `json:"id"`
		MS     int64  `json:"ms"`
	}
	var again struct {
		Status string `json:"status"`
		MS     int64  `json:"ms"`
	}
	var res struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exit_code"`
	}
	for _, line := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(line, "SNAPSHOT "); ok {
			json.Unmarshal([]byte(j), &snap)
		}
		if j, ok := strings.CutPrefix(line, "RUN "); ok {
			json.Unmarshal([]byte(j), &res)
		}
		if j, ok := strings.CutPrefix(line, "AGAIN "); ok {
			json.Unmarshal([]byte(j), &again)
		}
	}
	if snap.Status != "ready" || res.ExitCode != 0 || !strings.Contains(res.Stdout, "built-by-buildkit") || !strings.Contains(res.Stdout, "/bin/sh") {
		t.Fatalf("snapshot %+v, run %+v; want a ready snapshot whose sandbox has the built /greeting and busybox's links\n%s", snap, res, out)
	}
	t.Logf("createSnapshotFromDockerfile took %d ms, %d ms again with the builder snapshot made", snap.MS, again.MS)
	if again.Status != "ready" {
		t.Fatalf("second build: %+v\n%s", again, out)
	}
	boxes, err := d.Client.ListSandboxes(ctx, cubicle.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range boxes.Sandboxes {
		if strings.HasPrefix(b.Name, "snapshot-builder-") {
			t.Errorf("builder sandbox %s left behind (%s)", b.Name, b.Status)
		}
	}
}

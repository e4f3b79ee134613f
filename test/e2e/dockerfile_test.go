package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// buildDockerfile is a two-stage build on the test image: 7 layer steps
// (WORKDIR, COPY, RUN in the builder; WORKDIR, COPY --from, COPY, RUN in
// the final stage), ARGs global and per stage.
const buildDockerfile = `ARG BASE
FROM ${BASE} AS builder
ARG GREETING=hello
WORKDIR /src
COPY gen.sh ./
RUN sh gen.sh "$GREETING" > /src/out.txt
FROM ${BASE}
ENV APP_MODE=prod
LABEL team=core
WORKDIR /app
COPY --from=builder /src/out.txt ./out.txt
COPY data/ ./data/
RUN ls /app/data > /app/listing.txt
USER 1000
CMD ["sh", "-c", "cat /app/out.txt"]
`

// buildContextDir writes the build context: the Dockerfile, a script the
// builder runs, data the final stage copies, and what .dockerignore keeps
// out (data/*.tmp, secret.txt).
func buildContextDir(t *testing.T) string {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"Dockerfile":    buildDockerfile,
		".dockerignore": "data/*.tmp\nsecret.txt\n",
		"gen.sh":        `echo "$1 from the builder"` + "\n",
		"data/a.txt":    "a\n",
		"data/b.txt":    "b\n",
		"data/junk.tmp": "junk\n",
		"secret.txt":    "secret\n",
	} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// tarDir is dir as a tar stream of relative names.
func tarDir(t *testing.T, dir string) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	return &buf
}

// builtSnapshot is a finished build: its record, log and step counts.
type builtSnapshot struct {
	sn          *protocol.Snapshot
	log         string
	cached, ran int
	steps       time.Duration // the daemon's own time for the steps
	err         error
}

var builtRE = regexp.MustCompile(`built (\d+) layer steps \((\d+) cached\) in ([0-9.]+)s`)

// buildSnapshot runs a build through the SDK and follows it to the end.
func buildSnapshot(t *testing.T, c *cubicle.Client, req protocol.BuildSnapshotRequest, dir string) builtSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sn, err := c.BuildSnapshot(ctx, req, tarDir(t, dir))
	if err != nil {
		t.Fatalf("build %s: %v", req.Name, err)
	}
	if sn.Status != protocol.SnapshotBuilding {
		t.Fatalf("a new build is %s, want building", sn.Status)
	}
	return followBuild(t, c, sn.ID)
}

func followBuild(t *testing.T, c *cubicle.Client, id string) builtSnapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var log strings.Builder
	if err := c.FollowBuildLog(ctx, id, &log); err != nil {
		t.Fatalf("follow build log: %v", err)
	}
	b := builtSnapshot{log: log.String()}
	b.sn, b.err = c.WaitSnapshot(ctx, id, nil)
	b.cached = strings.Count(b.log, " CACHED\n")
	b.ran = len(regexp.MustCompile(`(?m)^#\d+ DONE `).FindAllString(b.log, -1))
	if m := builtRE.FindStringSubmatch(b.sn.StatusMessage); m != nil {
		secs, _ := strconv.ParseFloat(m[3], 64)
		b.steps = time.Duration(secs * float64(time.Second))
	}
	return b
}

// TestDockerfileBuild builds a multi-stage Dockerfile with ARGs and a
// .dockerignore, boots it and checks its files and run_config; rebuilds it
// unchanged (every step cached, within 1 s), after changing one copied
// file (only the steps from there re-run), and with --no-cache through
// the CLI; a failing RUN leaves a failed snapshot with its output; bad
// Dockerfiles are 422s naming the line.
func TestDockerfileBuild(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	dir := buildContextDir(t)
	req := protocol.BuildSnapshotRequest{Name: "app", BuildArgs: map[string]string{"BASE": ref, "GREETING": "howdy"}}

	first := buildSnapshot(t, c, req, dir)
	if first.err != nil {
		t.Fatalf("build: %v\n%s", first.err, first.log)
	}
	t.Logf("first build: steps %v", first.steps)
	if first.cached != 0 || first.ran != 7 {
		t.Fatalf("first build: %d cached, %d ran, want 0 and 7\n%s", first.cached, first.ran, first.log)
	}
	rc := first.sn.RunConfig
	if rc == nil || rc.User != "1000" || rc.WorkDir != "/app" || rc.EnvVars["APP_MODE"] != "prod" || first.sn.Labels["team"] != "core" {
		t.Fatalf("run_config %+v labels %v", rc, first.sn.Labels)
	}
	sb := newSandbox(t, c, first.sn.ID, nil)
	if out := mustRun(t, c, sb.Name, "cat out.txt; cat listing.txt; id -u; echo $APP_MODE"); out != "howdy from the builder\na.txt\nb.txt\n1000\nprod\n" {
		t.Fatalf("built sandbox: %q", out)
	}
	if out := mustRun(t, c, sb.Name, "ls /app/data /src 2>&1; ls / | grep -c secret || true"); strings.Contains(out, "junk") || strings.Contains(out, "gen.sh") || !strings.HasSuffix(out, "0\n") {
		t.Fatalf("ignored or builder-only files reached the result: %q", out)
	}

	t0 := time.Now()
	again := buildSnapshot(t, c, req, dir)
	wall := time.Since(t0)
	if again.err != nil || again.cached != 7 || again.ran != 0 {
		t.Fatalf("unchanged rebuild: %v, %d cached, %d ran\n%s", again.err, again.cached, again.ran, again.log)
	}
	if again.steps > time.Second {
		t.Fatalf("unchanged rebuild took %v for its steps, want ≤ 1 s", again.steps)
	}
	t.Logf("cached rebuild: steps %v, request to ready %v", again.steps, wall)

	if err := os.WriteFile(filepath.Join(dir, "data", "b.txt"), []byte("B\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := buildSnapshot(t, c, req, dir)
	if changed.err != nil || changed.cached != 5 || changed.ran != 2 {
		t.Fatalf("rebuild after a data change: %v, %d cached, %d ran, want 5 and 2\n%s", changed.err, changed.cached, changed.ran, changed.log)
	}

	var id bytes.Buffer
	cubicleCLI(t, d, nil, &id, "snapshot", "build", "app-nocache", dir, "--no-cache", "--build-arg", "BASE="+ref)
	nocache := followBuild(t, c, strings.TrimSpace(id.String()))
	if nocache.err != nil || nocache.cached != 0 || nocache.ran != 7 {
		t.Fatalf("--no-cache build: %v, %d cached, %d ran\n%s", nocache.err, nocache.cached, nocache.ran, nocache.log)
	}

	failed := buildSnapshot(t, c, protocol.BuildSnapshotRequest{Name: "broken", Dockerfile: "FROM " + ref + "\nRUN echo made > /made\nRUN echo boom-output; exit 7\n"}, t.TempDir())
	if !errors.Is(failed.err, cubicle.ErrSnapshotFailed) || !strings.Contains(failed.sn.StatusMessage, "boom-output") ||
		!strings.Contains(failed.sn.StatusMessage, "exit code 7") || !strings.Contains(failed.sn.StatusMessage, "line 3") {
		t.Fatalf("failing RUN: %v, status %q", failed.err, failed.sn.StatusMessage)
	}
	ctx := context.Background()
	if _, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: failed.sn.ID}); err == nil {
		t.Fatal("a sandbox booted from a failed build")
	}

	for df, line := range map[string]string{
		"FROM " + ref + "\nRUN true\nHEALTHCHECK CMD true\n":        "line 3",
		"FROM " + ref + "\nNOPE x\n":                                "line 2",
		"FROM " + ref + "\nRUN --mount=type=cache,target=/c true\n": "line 2",
	} {
		_, err := c.BuildSnapshot(ctx, protocol.BuildSnapshotRequest{Name: "bad", Dockerfile: df}, nil)
		var ae *cubicle.APIError
		if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Message, line) {
			t.Errorf("bad Dockerfile %q: %v, want a 422 naming %s", df, err, line)
		}
	}
}

// TestDockerfileStartCommand checks a built snapshot's CMD runs at every
// boot, detached, and that a sandbox turns ready only once ready_cmd
// passes.
func TestDockerfileStartCommand(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	df := "FROM " + ref + "\nWORKDIR /srv\nCMD [\"sh\", \"-c\", \"echo x >> /srv/starts; sleep 1; echo up > /tmp/up; exec sleep 3600\"]\n"
	b := buildSnapshot(t, c, protocol.BuildSnapshotRequest{Name: "server", Dockerfile: df, ReadyCmd: "test -e /tmp/up"}, t.TempDir())
	if b.err != nil {
		t.Fatalf("build: %v\n%s", b.err, b.log)
	}
	if b.sn.StartCmd == "" || b.sn.ReadyCmd != "test -e /tmp/up" {
		t.Fatalf("start_cmd %q ready_cmd %q", b.sn.StartCmd, b.sn.ReadyCmd)
	}
	t0 := time.Now()
	sb := newSandbox(t, c, b.sn.ID, nil)
	if waited := time.Since(t0); waited < time.Second {
		t.Fatalf("sandbox ready after %v, before the probe could pass", waited)
	}
	if out := mustRun(t, c, sb.Name, "cat /tmp/up /srv/starts; ps | grep -c '[s]leep 3600'"); out != "up\nx\n1\n" {
		t.Fatalf("after boot: %q", out)
	}
	ctx := context.Background()
	if err := c.StopSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.StartSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	if out := mustRun(t, c, sb.Name, "wc -l < /srv/starts; ps | grep -c '[s]leep 3600'"); strings.Fields(out)[0] != "2" || !strings.HasSuffix(out, "1\n") {
		t.Fatalf("after a restart: %q", out)
	}
}

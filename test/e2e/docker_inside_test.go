package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestDockerInside: on gvisor, the first create naming snapshot "docker"
// builds the built-in docker blueprint (the default computer plus
// Debian's docker.io) and boots it with docker: true, dockerd started
// and answering; as the user, `docker load` of a tarball made here,
// `docker run` of it, `docker build` of a two-line Dockerfile FROM it
// and `docker-compose up` work; a nested container's connections are
// held to the sandbox's egress policy (an allowed address answers,
// another is refused); a stop and start brings dockerd back (its images,
// in memory, gone). The same snapshot with docker: false boots without
// Docker: dockerd fails on its own (no overlay mount). The namespace
// runtime answers 422.
func TestDockerInside(t *testing.T) {
	t.Run("namespace", func(t *testing.T) {
		d := startDaemon(t, "namespace", "")
		st, body := call(t, d, "POST", "/v2/sandboxes/boxes", map[string]any{"name": "x", "docker": true})
		pydantic(t, st, body, "docker")
	})
	t.Run("gvisor", testDockerInsideGvisor)
}

func testDockerInsideGvisor(t *testing.T) {
	e := newEgressEnvArgs(t, "gvisor", []string{"--blueprint-cache", blueprintCache()})
	c := e.d.Client
	ctx := context.Background()
	allowed, refused := e.in.addr(0), e.in.addr(3)
	policy := json.RawMessage(fmt.Sprintf(`{"access_control":{"allow_list":["%s/32"]}}`, allowed))

	start := time.Now()
	sb := newDockerSandbox(t, e, "dock", policy, nil)
	t.Logf("first create of snapshot docker (blueprint build included): %s", time.Since(start).Round(time.Second))
	if !sb.Docker {
		t.Fatal("a sandbox of the docker snapshot does not say docker: true")
	}
	if sn, err := c.GetSnapshot(ctx, sb.SnapshotID); err != nil || !sn.Docker || !sn.Builtin || sn.Packages["docker.io"] == "" {
		t.Fatalf("snapshot docker: %+v, %v; want a built-in with docker: true and docker.io", sn, err)
	}

	var img bytes.Buffer
	if err := tarball.Write(name.MustParseReference("e2e/busybox:latest"), imagetest.BusyboxImage(t), &img); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, sb.Name, "busybox.tar", &img); err != nil {
		t.Fatal(err)
	}
	step := func(what, command, want string) {
		t.Helper()
		t0 := time.Now()
		out := mustRun(t, c, sb.Name, command)
		if !strings.Contains(out, want) {
			t.Fatalf("%s: %q printed %q, want %q", what, command, out, want)
		}
		t.Logf("%s: %s", what, time.Since(t0).Round(time.Millisecond))
	}
	step("docker load", "docker load -i busybox.tar", "Loaded image: e2e/busybox:latest")
	step("docker run", "docker run --rm e2e/busybox:latest echo hello from a nested container", "hello from a nested container")
	step("docker build", `mkdir -p ctx && printf 'FROM e2e/busybox:latest\nRUN echo built-inside > /built\n' >ctx/Dockerfile && docker build -t e2e/built ctx && docker run --rm e2e/built cat /built`, "built-inside")
	step("docker-compose up", `mkdir -p app && printf 'services:\n  hello:\n    image: e2e/busybox:latest\n    command: echo composed\n' >app/docker-compose.yml && cd app && docker-compose up`, "composed")

	// The nested container's traffic leaves through the sandbox's veth:
	// the allowed address answers, one outside the list is refused.
	step("nested egress allowed", "docker run --rm e2e/busybox:latest nc -w 3 "+allowed+" 7000 </dev/null", "raw ok")
	out, errs, code := run(t, c, sb.Name, "docker run --rm e2e/busybox:latest nc -w 5 "+refused+" 7000 </dev/null")
	if code == 0 || strings.Contains(out, "raw ok") {
		t.Fatalf("a nested container reached %s, outside the allow list: exit %d %q %q", refused, code, out, errs)
	}

	// A stop and start boots dockerd again; its images lived in memory.
	if err := c.StopSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.StartSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	t.Logf("start after a stop, dockerd answering: %s", time.Since(t0).Round(time.Millisecond))
	if out := mustRun(t, c, sb.Name, "docker images -q e2e/busybox"); strings.TrimSpace(out) != "" {
		t.Fatalf("images survived a stop: %q", out)
	}
	step("docker run after a restart", "docker load -i busybox.tar && docker run --rm e2e/busybox:latest echo again", "again")

	// Without the opt-in, the same image's dockerd cannot start.
	off := newDockerSandbox(t, e, "nodock", policy, func(r *protocol.CreateSandboxRequest) { r.Docker = ptrBool(false) })
	if off.Docker {
		t.Fatal("docker: false was not kept")
	}
	if out, errs, code := run(t, c, off.Name, "docker info"); code == 0 {
		t.Fatalf("docker info without the opt-in succeeded: %q %q", out, errs)
	}
	log := mustRun(t, c, off.Name, "cat /tmp/cubicle-start.log")
	if !strings.Contains(log, "failed to mount overlay: operation not permitted") || !strings.Contains(log, "failed to start daemon") {
		t.Fatalf("dockerd without the opt-in logged %q; want it to fail on the overlay mount", log)
	}
}

// newDockerSandbox creates a sandbox of the built-in snapshot docker
// with egress policy pc (waiting through the blueprint's build).
func newDockerSandbox(t *testing.T, e *egressEnv, name string, pc json.RawMessage, mutate func(*protocol.CreateSandboxRequest)) *protocol.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	req := protocol.CreateSandboxRequest{Name: name, SnapshotName: "docker", ProxyConfig: pc, WaitForReady: ptrBool(true), Timeout: int64p(600)}
	if mutate != nil {
		mutate(&req)
	}
	sb, err := e.d.Client.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("create %s from snapshot docker: %v\n%s", name, err, e.d.logs.String())
	}
	if sb.Status != protocol.StatusReady {
		t.Fatalf("sandbox %s is %s (%s)", sb.Name, sb.Status, sb.StatusMessage)
	}
	return sb
}

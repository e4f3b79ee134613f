package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// clientVersions are the official npm client's versions every
// conformance run covers: the one the protocol notes describe and the
// newest.
var clientVersions = []string{"0.10", "0.12"}

// npmDir returns a directory with the official `langsmith` client 0.10
// installed (and `ws` too when withWS), cached under .cache/ between runs.
func npmDir(t testing.TB, withWS bool) string { return npmDirVersion(t, "0.10", withWS) }

// npmDirVersion is npmDir for client version v.
func npmDirVersion(t testing.TB, v string, withWS bool) string {
	name := "npm-nows"
	pkgs := []string{"langsmith@" + v}
	if withWS {
		name, pkgs = "npm-ws", append(pkgs, "ws@8")
	}
	if v != "0.10" {
		name += "-" + v // 0.10 keeps its old cache directory
	}
	return npmPackages(t, name, pkgs...)
}

// npmPackages returns .cache/<name> with the npm packages pkgs
// ("name@version") installed, installing them on first use; the first
// package's directory marks the cache as complete.
func npmPackages(t testing.TB, name string, pkgs ...string) string {
	dir := filepath.Join(repoRoot(t), ".cache", name)
	first := pkgs[0]
	if i := strings.LastIndex(first, "@"); i > 0 {
		first = first[:i]
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", first)); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Fatalf("npm is required for the official-client tests: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "package.json"), []byte(`{"name":"cubicle-conformance","private":true,"type":"module"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", append([]string{"install", "--no-audit", "--no-fund", "--silent"}, pkgs...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install %v: %v\n%s", pkgs, err, out)
	}
	return dir
}

// TestOfficialClientSmoke runs the spec's smoke script with the unmodified
// official client against the gvisor daemon, over both exec transports.
func TestOfficialClientSmoke(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	for _, tc := range []struct {
		name string
		ws   bool
		path string
	}{{"websocket", true, "exec-path=websocket"}, {"http", false, "exec-path=http"}} {
		t.Run(tc.name, func(t *testing.T) {
			out := runSmoke(t, npmDir(t, tc.ws), d.Endpoint, ref)
			if !strings.Contains(out, tc.path) {
				t.Fatalf("smoke did not pass over %s", tc.path)
			}
		})
	}
}

// runSmoke runs the spec's smoke script with the official client installed
// in dir against endpoint, booting image ref, and returns its output; a
// failing script fails t.
func runSmoke(t *testing.T, dir, endpoint, ref string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "conformance", "smoke-langsmith-client.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "smoke.mjs")
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+endpoint, "LANGSMITH_API_KEY="+testKey, "SMOKE_IMAGE="+ref)
	out, err := cmd.CombinedOutput()
	t.Logf("smoke output:\n%s", out)
	if err != nil || !strings.Contains(string(out), "SMOKE PASSED") {
		t.Fatalf("smoke failed: %v", err)
	}
	return string(out)
}

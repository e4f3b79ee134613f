package mounts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
)

func gitConfig(url, ref string, refresh int) []byte {
	extra := ""
	if ref != "" {
		extra += `,"ref":` + ref
	}
	if refresh > 0 {
		extra += fmt.Sprintf(`,"refresh_interval_seconds":%d`, refresh)
	}
	return fmt.Appendf(nil, `{"mounts":[{"id":"g","type":"git","mount_path":"/repo","git":{"remote_url":%q%s}}]}`, url+"/repo.git", extra)
}

// TestGitMount checks out branch and tag refs from a real git HTTPS server
// whose CA the service is given, read-only, and a refresh picks up a new
// commit in place.
func TestGitMount(t *testing.T) {
	g := mountstest.StartGit(t)
	g.Commit(t, "main", "f.txt", "v1")
	g.Tag(t, "v1")
	g.Commit(t, "main", "f.txt", "v2")
	g.Commit(t, "dev", "f.txt", "dev1")
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir(), ExtraRootsPEM: g.CAPEM})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, tc := range []struct{ id, ref, want string }{
		{"head", "", "v2"},
		{"branch", `{"type":"branch","name":"dev"}`, "dev1"},
		{"tag", `{"type":"tag","name":"v1"}`, "v1"},
	} {
		binds, err := svc.Up(ctx, tc.id, "ws", gitConfig(g.URL, tc.ref, 0), nil)
		if err != nil {
			t.Fatalf("%s: %v", tc.id, err)
		}
		if len(binds) != 1 || !binds[0].ReadOnly || binds[0].Target != "/repo" {
			t.Fatalf("%s: binds = %+v", tc.id, binds)
		}
		if b, _ := os.ReadFile(filepath.Join(binds[0].Source, "f.txt")); string(b) != tc.want {
			t.Fatalf("%s: f.txt = %q, want %q", tc.id, b, tc.want)
		}
		if err := svc.Remove(ctx, tc.id); err != nil {
			t.Fatal(err)
		}
	}
	// Refresh in place: the same directory shows the new commit.
	binds, err := svc.Up(ctx, "live", "ws", gitConfig(g.URL, `{"type":"branch","name":"main"}`, 1), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Remove(ctx, "live")
	g.Commit(t, "main", "f.txt", "v3")
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(binds[0].Source, "f.txt"))
		if string(b) == "v3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("f.txt = %q after a refresh, want v3", b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if h := svc.Health("live"); h != "mounts: /repo (git) ok" {
		t.Fatalf("health = %q", h)
	}
}

// TestGitMountErrors: an untrusted CA and a missing ref fail Up with
// git's answer.
func TestGitMountErrors(t *testing.T) {
	g := mountstest.StartGit(t)
	g.Commit(t, "main", "f.txt", "v1")
	ctx := context.Background()
	untrusting, err := New(Options{AllowLoopback: true, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := untrusting.Up(ctx, "a", "ws", gitConfig(g.URL, "", 0), nil); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("Up against an untrusted CA: %v", err)
	}
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir(), ExtraRootsPEM: g.CAPEM})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Up(ctx, "b", "ws", gitConfig(g.URL, `{"type":"tag","name":"nope"}`, 0), nil); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("Up of a missing tag: %v", err)
	}
	if _, err := os.Stat(filepath.Join(svc.opt.Dir, "b")); !os.IsNotExist(err) {
		t.Fatalf("a failed Up left its directory: %v", err)
	}
}

// TestMountEndpointsRefused: without AllowLoopback a loopback store or
// remote is refused, and link-local (cloud metadata) always is.
func TestMountEndpointsRefused(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	g := mountstest.StartGit(t)
	g.Commit(t, "main", "f.txt", "v1")
	ctx := context.Background()
	strict, err := New(Options{Dir: t.TempDir(), ExtraRootsPEM: g.CAPEM})
	if err != nil {
		t.Fatal(err)
	}
	for what, cfg := range map[string][]byte{"s3": s3Config(srv, "bkt", ""), "git": gitConfig(g.URL, "", 0)} {
		if _, err := strict.Up(ctx, "a", "ws", cfg, nil); err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("%s on loopback without AllowLoopback: %v", what, err)
		}
	}
	loose, err := New(Options{Dir: t.TempDir(), AllowLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	meta := *srv
	meta.Endpoint = "http://169.254.169.254"
	for what, cfg := range map[string][]byte{"s3": s3Config(&meta, "bkt", ""), "git": gitConfig("https://169.254.169.254", "", 0)} {
		if _, err := loose.Up(ctx, "b", "ws", cfg, nil); err == nil || !strings.Contains(err.Error(), "link-local") {
			t.Errorf("%s on link-local: %v", what, err)
		}
	}
}

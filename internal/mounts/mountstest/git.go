package mountstest

import (
	"crypto/tls"
	"encoding/pem"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Git is a real git smart-HTTP server (git http-backend) behind a TLS
// test server whose certificate is CAPEM's. Repositories are bare ones
// under Root; Work is a clone of repo.git to commit and push from.
type Git struct {
	URL   string // https://127.0.0.1:port
	CAPEM []byte
	Root  string
	work  string
}

// StartGit serves an empty repo.git until the test ends.
func StartGit(t testing.TB) *Git {
	t.Helper()
	g := &Git{Root: t.TempDir(), work: filepath.Join(t.TempDir(), "work")}
	backend := "/usr/lib/git-core/git-http-backend"
	if out, err := exec.Command("git", "--exec-path").Output(); err == nil {
		backend = filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
	}
	h := &cgi.Handler{Path: backend, Env: []string{"GIT_PROJECT_ROOT=" + g.Root, "GIT_HTTP_EXPORT_ALL=1"}}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	g.URL = srv.URL
	g.CAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	g.git(t, "", "init", "-q", "--bare", "-b", "main", filepath.Join(g.Root, "repo.git"))
	g.git(t, "", "clone", "-q", filepath.Join(g.Root, "repo.git"), g.work)
	return g
}

// Commit writes file with content on branch (created if new) and pushes.
func (g *Git) Commit(t testing.TB, branch, file, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(g.work, file), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	g.git(t, g.work, "checkout", "-q", "-B", branch)
	g.git(t, g.work, "add", file)
	g.git(t, g.work, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", file+"="+content)
	g.git(t, g.work, "push", "-q", "origin", branch)
}

// Tag tags the work clone's HEAD as name and pushes it.
func (g *Git) Tag(t testing.TB, name string) {
	t.Helper()
	g.git(t, g.work, "tag", name)
	g.git(t, g.work, "push", "-q", "origin", name)
}

func (g *Git) git(t testing.TB, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v: %s", args, err, out)
	}
}

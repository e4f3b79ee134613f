package mounts

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// gitRepo is a git mount: a shallow checkout of one ref in a daemon-owned
// directory, bound read-only into the sandbox and, with a refresh
// interval, fetched and checked out again in place.
type gitRepo struct {
	dir     string
	spec    *Git
	env     []string
	resolve string // host:port:ip git is pinned to (http.curloptResolve)

	mu      sync.Mutex
	lastErr error
	stopc   chan struct{}
	done    chan struct{}
}

// gitTimeout bounds one clone or fetch; git's own low-speed limit ends a
// stalled transfer sooner.
const gitTimeout = 10 * time.Minute

// cloneGit checks m's ref out at dir (reusing an earlier checkout there)
// and starts its refresher.
func (s *Service) cloneGit(ctx context.Context, m Mount, dir string) (*gitRepo, error) {
	u, err := url.Parse(m.Git.RemoteURL)
	if err != nil {
		return nil, err
	}
	ip, err := s.checkHost(ctx, u.Hostname())
	if err != nil {
		return nil, err
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	r := &gitRepo{dir: dir, spec: m.Git, stopc: make(chan struct{}), done: make(chan struct{}),
		resolve: u.Hostname() + ":" + port + ":" + ip.String(),
		env: append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_SSL_CAINFO="+s.roots, "GIT_CONFIG_NOSYSTEM=1",
			"GIT_CONFIG_GLOBAL=/dev/null", "HOME="+filepath.Dir(dir), "GIT_ASKPASS=/bin/false")}
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := r.git(ctx, "init", "-q"); err != nil {
			return nil, err
		}
		if err := r.git(ctx, "remote", "add", "origin", m.Git.RemoteURL); err != nil {
			return nil, err
		}
	}
	if err := r.sync(ctx); err != nil {
		return nil, err
	}
	if m.Git.RefreshSeconds == 0 {
		close(r.done)
		return r, nil
	}
	go r.refresh(time.Duration(m.Git.RefreshSeconds) * time.Second)
	return r, nil
}

// refspec is the remote ref m follows.
func (r *gitRepo) refspec() string {
	switch r.spec.RefType {
	case "branch":
		return "refs/heads/" + r.spec.RefName
	case "tag":
		return "refs/tags/" + r.spec.RefName
	}
	return "HEAD"
}

// sync fetches the ref and checks it out, replacing the worktree's files.
func (r *gitRepo) sync(ctx context.Context) error {
	err := r.git(ctx, "fetch", "-q", "--depth=1", "--no-tags", "origin", r.refspec())
	if err == nil {
		err = r.git(ctx, "checkout", "-q", "--force", "--detach", "FETCH_HEAD")
	}
	r.mu.Lock()
	r.lastErr = err
	r.mu.Unlock()
	return err
}

func (r *gitRepo) refresh(every time.Duration) {
	defer close(r.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stopc:
			return
		case <-t.C:
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-r.stopc:
				case <-ctx.Done():
				}
				cancel()
			}()
			_ = r.sync(ctx) // recorded in health; the old checkout stays
			cancel()
		}
	}
}

// git runs git in the checkout with only https allowed (no file:// or
// ssh through a redirect or submodule) and a low-speed abort.
func (r *gitRepo) git(ctx context.Context, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, gitTimeout)
	defer cancel()
	full := append([]string{"-C", r.dir, "-c", "protocol.allow=never", "-c", "protocol.https.allow=always",
		"-c", "http.lowSpeedLimit=1024", "-c", "http.lowSpeedTime=60", "-c", "advice.detachedHead=false",
		"-c", "core.askPass=/bin/false", "-c", "http.curloptResolve=" + r.resolve}, args...)
	cmd := exec.CommandContext(ctx, "git", full...)
	cmd.Env = r.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("git %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (r *gitRepo) health() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

func (r *gitRepo) stop() {
	select {
	case <-r.stopc:
	default:
		close(r.stopc)
	}
	<-r.done
}

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// testUID is the sandbox user of these tests: numeric, so it needs no
// passwd entry (primary group = its own gid through "uid:gid").
const (
	testUID  = 4242
	testUser = "4242:4242"
)

// userTree builds, under a fresh directory every user can traverse:
//
//	etc/shadow        root 0640 (the target of the attacks)
//	etc/private       root 0700 dir
//	rootdir/          root 0755 (the user cannot write here)
//	realbin/tool      root 0755; bin → realbin (a root-owned link)
//	tmp/              root 1777
//	home/u/           the user's, with sub/file
func userTree(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t, "to act as another user")
	base := t.TempDir()
	for d := base; d != "/"; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o005 != 0o005 {
			if err := os.Chmod(d, st.Mode().Perm()|0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	mk := func(rel string, mode os.FileMode, body string) {
		p := filepath.Join(base, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if body == "<dir>" {
			if err := os.Mkdir(p, mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
			return
		}
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("etc/shadow", 0o640, "root:secret\n")
	mk("etc/private", 0o700, "<dir>")
	mk("etc/private/key", 0o600, "k")
	mk("rootdir", 0o755, "<dir>")
	mk("realbin/tool", 0o755, "#!/bin/sh\n")
	mk("tmp", 0o1777, "<dir>")
	mk("home/u/sub/file", 0o644, "mine")
	if err := os.Symlink("realbin", filepath.Join(base, "bin")); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(base, "home/u")
	for _, p := range []string{home, home + "/sub", home + "/sub/file"} {
		if err := os.Lchown(p, testUID, testUID); err != nil {
			t.Fatal(err)
		}
	}
	return base
}

// userLink makes a symlink owned by the test user.
func userLink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, testUID, testUID); err != nil {
		t.Fatal(err)
	}
}

func readAs(t *testing.T, c *Client, user, p string) (int, string) {
	t.Helper()
	resp, err := c.OpenFile(ctxT(t), user, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func writeStatus(err error) int {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	if err == nil {
		return http.StatusNoContent
	}
	return -1
}

// TestFileOpsRunAsUser: file calls for a non-root user get that user's
// permissions (no CAP_DAC_OVERRIDE), create files the user owns, and leave
// the agent's own credentials as they were.
func TestFileOpsRunAsUser(t *testing.T) {
	base := userTree(t)
	c, _, _ := startAgent(t)
	ctx := ctxT(t)
	home := filepath.Join(base, "home/u")

	if err := c.WriteFile(ctx, testUser, home+"/new/dir/f.txt", 0o640, strings.NewReader("hi")); err != nil {
		t.Fatalf("upload into the user's home: %v", err)
	}
	for _, p := range []string{home + "/new", home + "/new/dir", home + "/new/dir/f.txt"} {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil || st.Uid != testUID || st.Gid != testUID {
			t.Fatalf("%s: owner %d:%d (%v), want the user's", p, st.Uid, st.Gid, err)
		}
	}
	if st, code := readAs(t, c, testUser, home+"/new/dir/f.txt"); st != 200 || code != "hi" {
		t.Fatalf("read back as the user: %d %q", st, code)
	}
	if st := writeStatus(c.WriteFile(ctx, testUser, base+"/rootdir/x", 0o644, strings.NewReader("x"))); st != 403 {
		t.Fatalf("upload into a root-owned 0755 dir as the user: %d, want 403", st)
	}
	if _, err := os.Stat(base + "/rootdir/x"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused upload left %v", err)
	}
	if st := writeStatus(c.WriteFile(ctx, testUser, base+"/etc/shadow", 0o644, strings.NewReader("pwned"))); st != 403 {
		t.Fatalf("upload over root's file as the user: %d, want 403", st)
	}
	if st, _ := readAs(t, c, testUser, base+"/etc/shadow"); st != 403 {
		t.Fatalf("read of a root 0640 file as the user: %d, want 403", st)
	}
	if st, _ := readAs(t, c, testUser, base+"/etc/private/key"); st != 403 {
		t.Fatalf("read through a root 0700 dir as the user: %d, want 403", st)
	}
	if _, err := c.Stat(ctx, testUser, base+"/etc/private/key"); writeStatus(err) != 403 {
		t.Fatalf("stat through a root 0700 dir as the user: %v", err)
	}
	if st, body := readAs(t, c, "", base+"/etc/shadow"); st != 200 || body != "root:secret\n" {
		t.Fatalf("root still reads it: %d %q", st, body)
	}
	if st, _ := readAs(t, c, testUser, base+"/bin/tool"); st != 200 {
		t.Fatalf("a root-owned symlink (bin → realbin) is followed for the user: %d", st)
	}

	// Searches walk as the user: the 0700 dir is not entered.
	res, err := globAll(t, c, GlobRequest{Pattern: "**", Path: base + "/etc", User: testUser})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range res.Matches {
		if strings.HasSuffix(m.Path, "/key") {
			t.Fatalf("glob as the user listed %s inside a root 0700 dir", m.Path)
		}
	}
	gr, err := grepAll(t, c, GrepRequest{Pattern: "secret", Path: base, User: testUser})
	if err != nil || len(gr.Matches) != 0 {
		t.Fatalf("grep as the user read root's 0640 file: %+v %v", gr, err)
	}
	if gr, _ := grepAll(t, c, GrepRequest{Pattern: "secret", Path: base}); len(gr.Matches) != 1 {
		t.Fatalf("grep as root: %+v", gr)
	}

	// Concurrent user and root calls: the switch is per thread, so root's
	// never fail and the process stays root.
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if st, _ := readAs(t, c, testUser, base+"/etc/shadow"); st != 403 {
				errs <- fmt.Errorf("user read %d", st)
			}
		}()
		go func() {
			defer wg.Done()
			if err := c.WriteFile(ctx, "", fmt.Sprintf("%s/etc/private/r%d", base, i), 0o600, strings.NewReader("r")); err != nil {
				errs <- fmt.Errorf("root write: %w", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 || os.Getegid() != 0 {
		t.Fatalf("agent credentials changed: %d:%d", os.Geteuid(), os.Getegid())
	}
}

// TestSymlinkRule: a symlink the user could have planted is followed only
// while it stays inside the user-owned directories holding it.
func TestSymlinkRule(t *testing.T) {
	base := userTree(t)
	c, _, _ := startAgent(t)
	ctx := ctxT(t)
	home := filepath.Join(base, "home/u")
	shadow := base + "/etc/shadow"
	// Open up the target so only the symlink rule stands in the way.
	if err := os.Chmod(shadow, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base+"/etc", 0o777); err != nil {
		t.Fatal(err)
	}
	userLink(t, base+"/etc", home+"/etcdir")     // dir link out
	userLink(t, shadow, home+"/x")               // file link out
	userLink(t, "../../etc/shadow", home+"/rel") // relative link out
	userLink(t, "sub/file", home+"/in")          // inside, relative
	userLink(t, "sub/../../../etc/shadow", home+"/inout")
	userLink(t, home+"/sub", home+"/abs")        // inside, absolute
	userLink(t, home+"/sub/file", base+"/tmp/l") // the user's link in /tmp

	cases := []struct {
		path, why string
		want      int
	}{
		{home + "/etcdir/shadow", "directory link out of the home", 403},
		{home + "/x", "file link to /etc/shadow", 403},
		{home + "/rel", "relative link climbing out", 403},
		{home + "/inout", "link going in, then '..' out of the home", 403},
		{base + "/tmp/l", "the user's link in a directory the user does not own", 403},
		{home + "/in", "relative link inside the home", 200},
		{home + "/abs/file", "absolute link inside the home", 200},
	}
	for _, tc := range cases {
		if st, _ := readAs(t, c, testUser, tc.path); st != tc.want {
			t.Errorf("read %s (%s): %d, want %d", tc.path, tc.why, st, tc.want)
		}
	}
	// The attack: upload through the user's directory link onto shadow.
	if st := writeStatus(c.WriteFile(ctx, testUser, home+"/etcdir/shadow", 0o644, strings.NewReader("pwned"))); st != 403 {
		t.Fatalf("upload through a link out of the home: %d, want 403", st)
	}
	// Uploading to the file link replaces the link, never its target.
	if err := c.WriteFile(ctx, testUser, home+"/x", 0o644, strings.NewReader("replaced")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(shadow); string(b) != "root:secret\n" {
		t.Fatalf("shadow changed: %q", b)
	}
	if fi, err := os.Lstat(home + "/x"); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the link was not replaced by the upload: %v %v", fi, err)
	}
	if err := c.WriteFile(ctx, testUser, home+"/abs/up.txt", 0o644, strings.NewReader("ok")); err != nil {
		t.Fatalf("upload through a link inside the home: %v", err)
	}
	if b, _ := os.ReadFile(home + "/sub/up.txt"); string(b) != "ok" {
		t.Fatalf("upload through the inside link landed elsewhere: %q", b)
	}
	if _, err := globAll(t, c, GlobRequest{Pattern: "*", Path: home + "/etcdir", User: testUser}); writeStatus(err) != 403 {
		t.Fatalf("glob rooted at a link out of the home: %v", err)
	}
	// A loop is an error, not a hang.
	userLink(t, "loop2", home+"/loop1")
	userLink(t, "loop1", home+"/loop2")
	if st, _ := readAs(t, c, testUser, home+"/loop1"); st != 400 {
		t.Fatalf("symlink loop: %d, want 400", st)
	}
}

// TestDownloadNotRegular: kernel pseudo-files, devices and FIFOs are
// client errors (400), never a 500 or a hang.
func TestDownloadNotRegular(t *testing.T) {
	c, _, _ := startAgent(t)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/proc/self/mountinfo", "/proc/self/status", "/sys/kernel/mm/transparent_hugepage/enabled", "/dev/null", fifo} {
		if _, err := os.Stat(p); err != nil {
			continue // not on this host
		}
		start := time.Now()
		st, body := readAs(t, c, "", p)
		if st != 400 || !strings.Contains(body, "not a regular file") || time.Since(start) > 5*time.Second {
			t.Errorf("download %s: %d %s after %v", p, st, body, time.Since(start))
		}
	}
}

// TestSearchAnswerBounded: whatever an agent sends, the daemon's client
// reads at most MaxSearchBytes plus slack of a search answer and reports
// what it got as truncated.
func TestSearchAnswerBounded(t *testing.T) {
	var sent int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{w: w, n: &sent}
		io.WriteString(cw, `{"matches":[`)
		long := strings.Repeat("a", 4000)
		for i := 0; ; i++ {
			if i > 0 {
				io.WriteString(cw, ",")
			}
			if _, err := fmt.Fprintf(cw, `{"path":"/%s/%d","is_dir":false,"size_bytes":1}`, long, i); err != nil {
				return
			}
			if sent > 4*MaxSearchBytes {
				return // a well-behaved test server stops eventually
			}
		}
	}))
	defer hs.Close()
	c := NewClient(strings.TrimPrefix(hs.URL, "http://"), testToken)
	defer c.Close()
	var got int64
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	truncated, err := c.Glob(ctx, GlobRequest{Pattern: "**"}, func(m GlobMatch) error {
		got += int64(len(m.Path))
		return nil
	})
	if err != nil || !truncated {
		t.Fatalf("unbounded answer: truncated=%v err=%v", truncated, err)
	}
	if got == 0 || got > MaxSearchBytes+searchSlack {
		t.Fatalf("read %d bytes of paths, want 0 < n ≤ %d", got, MaxSearchBytes+searchSlack)
	}
}

type countingWriter struct {
	w io.Writer
	n *int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	return n, err
}

// TestSearchCapsBytes: the agent stops adding matches at its byte budget.
func TestSearchCapsBytes(t *testing.T) {
	caps := newSearchCaps(context.Background(), maxSearchLimit)
	defer caps.cancel()
	n := 0
	for caps.take(4000) {
		n++
	}
	if want := MaxSearchBytes / (4000 + matchOverhead); n != want || !caps.truncated(nil) {
		t.Fatalf("admitted %d matches of 4000 bytes, want %d", n, want)
	}
}

// TestRelativeFilePath: a relative path resolves where the user's commands
// start (the home), for writes, reads and stats alike.
func TestRelativeFilePath(t *testing.T) {
	base := userTree(t)
	c, srv, _ := startAgent(t)
	home := filepath.Join(base, "home/u")
	srv.root = t.TempDir()
	os.MkdirAll(filepath.Join(srv.root, "etc"), 0o755)
	os.WriteFile(filepath.Join(srv.root, "etc/passwd"), []byte(fmt.Sprintf("u:x:%d:%d::%s:/bin/sh\n", testUID, testUID, home)), 0o644)
	ctx := ctxT(t)
	if err := c.WriteFile(ctx, "u", "out/data.txt", 0o644, strings.NewReader("rel")); err != nil {
		t.Fatalf("relative upload: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(home, "out/data.txt")); err != nil || string(b) != "rel" {
		t.Fatalf("home/out/data.txt = %q, %v; want the relative upload there", b, err)
	}
	if st, body := readAs(t, c, "u", "sub/file"); st != 200 || body != "mine" {
		t.Fatalf("relative read of sub/file: %d %q", st, body)
	}
	if fi, err := c.Stat(ctx, "u", "./out/../out/data.txt"); err != nil || fi.Path != home+"/out/data.txt" {
		t.Fatalf("stat of a relative path: %+v, %v; want %s/out/data.txt", fi, err, home)
	}
}

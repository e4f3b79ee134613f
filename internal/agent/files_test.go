package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestWriteReadFile(t *testing.T) {
	c, _, _ := startAgent(t)
	ctx := ctxT(t)
	p := filepath.Join(t.TempDir(), "a", "b", "f.txt")
	data := []byte("0123456789abcdef")
	if err := c.WriteFile(ctx, "", p, 0o600, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v %v", st, err)
	}
	if pst, _ := os.Stat(filepath.Dir(p)); pst.Mode().Perm() != 0o755 {
		t.Fatalf("parent mode %v", pst.Mode())
	}
	resp, err := c.OpenFile(ctx, "", p, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	etag := resp.Header.Get("ETag")
	if resp.StatusCode != 200 || !bytes.Equal(body, data) || !strings.HasPrefix(etag, `"`) || resp.Header.Get("Last-Modified") == "" {
		t.Fatalf("read %d %q etag %q", resp.StatusCode, body, etag)
	}

	get := func(h http.Header) (*http.Response, string) {
		t.Helper()
		resp, err := c.OpenFile(ctx, "", p, h)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	r, b := get(http.Header{"Range": {"bytes=2-5"}})
	if r.StatusCode != 206 || b != "2345" || r.Header.Get("Content-Range") != "bytes 2-5/16" {
		t.Fatalf("range: %d %q %q", r.StatusCode, b, r.Header.Get("Content-Range"))
	}
	r, b = get(http.Header{"Range": {"bytes=10-100"}})
	if r.StatusCode != 206 || b != "abcdef" {
		t.Fatalf("clamped range: %d %q", r.StatusCode, b)
	}
	r, _ = get(http.Header{"If-None-Match": {etag}})
	if r.StatusCode != 304 {
		t.Fatalf("if-none-match: %d", r.StatusCode)
	}
	r, _ = get(http.Header{"Range": {"bytes=100-"}})
	if r.StatusCode != 416 || r.Header.Get("Content-Range") != "bytes */16" {
		t.Fatalf("416: %d %q", r.StatusCode, r.Header.Get("Content-Range"))
	}
	r, b = get(http.Header{"Range": {"bytes=0-1"}, "If-Range": {`"stale"`}})
	if r.StatusCode != 200 || b != string(data) {
		t.Fatalf("stale if-range: %d", r.StatusCode)
	}
	hr, err := c.HeadFile(ctx, "", p, nil)
	if err != nil || hr.StatusCode != 200 || hr.ContentLength != 16 || hr.Header.Get("ETag") != etag {
		t.Fatalf("head %v %v", hr, err)
	}
	hr.Body.Close()

	// Overwrite: new content, new strong validator.
	if err := c.WriteFile(ctx, "", p, 0o644, strings.NewReader("new")); err != nil {
		t.Fatal(err)
	}
	r, b = get(http.Header{"If-None-Match": {etag}})
	if r.StatusCode != 200 || b != "new" || r.Header.Get("ETag") == etag {
		t.Fatalf("after overwrite: %d %q", r.StatusCode, b)
	}
	fi, err := c.Stat(ctx, "", p)
	if err != nil || fi.Size != 3 || fi.IsDir || fi.Mode != 0o644 || fi.Path != p {
		t.Fatalf("stat %+v %v", fi, err)
	}
}

func TestFileErrors(t *testing.T) {
	c, _, addr := startAgent(t)
	ctx := ctxT(t)
	dir := t.TempDir()
	resp, err := c.OpenFile(ctx, "", filepath.Join(dir, "missing"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var body protocol.ErrorBody
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 404 || body.Detail.Error != "FileNotFound" {
		t.Fatalf("missing: %d %+v", resp.StatusCode, body)
	}
	resp, _ = c.OpenFile(ctx, "", dir, nil)
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != 400 || body.Detail.Error != "ReadError" || !strings.Contains(body.Detail.Message, "is a directory") {
		t.Fatalf("dir: %d %+v", resp.StatusCode, body)
	}
	err = c.WriteFile(ctx, "", dir, 0o644, strings.NewReader("x"))
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != 400 || he.Kind != "WriteError" {
		t.Fatalf("write over dir: %v", err)
	}
	if _, err := c.Stat(ctx, "", filepath.Join(dir, "missing")); !errors.Is(err, ErrFileNotFound) {
		t.Fatalf("stat missing: %v", err)
	}

	bad := NewClient(addr, "wrong")
	defer bad.Close()
	if err := bad.Health(ctx); !errors.As(err, &he) || he.Status != 401 {
		t.Fatalf("wrong token health: %v", err)
	}
	if _, err := bad.DialExec(ctx); !errors.As(err, &he) || he.Status != 401 {
		t.Fatalf("wrong token exec: %v", err)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/health", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil || r.StatusCode != 401 {
		t.Fatalf("no token: %v %v", r, err)
	}
	r.Body.Close()
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWaitReady(t *testing.T) {
	addr := freeAddr(t)
	c := NewClient(addr, testToken)
	defer c.Close()
	srv, err := NewServer(testToken)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		hs := &http.Server{Handler: srv}
		t.Cleanup(func() { hs.Close() })
		hs.Serve(ln)
	}()
	start := time.Now()
	if err := c.WaitReady(ctxT(t), 2*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("ready after %v", d)
	}
	bad := NewClient(addr, "wrong")
	defer bad.Close()
	if err := bad.WaitReady(ctxT(t), 2*time.Millisecond); err == nil {
		t.Fatal("wrong token became ready")
	}
}

// TestFSErrorStatus: what a request or the sandbox's files cause is a 4xx;
// only other faults are a 500.
func TestFSErrorStatus(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{fs.ErrNotExist, 404}, {syscall.EACCES, 403}, {syscall.EPERM, 403}, {syscall.EROFS, 403}, {errSymlinkEscape, 403},
		{errIsDir, 400}, {errNotRegular, 400}, {syscall.ELOOP, 400}, {syscall.ENAMETOOLONG, 400},
		{fmt.Errorf("%w: %w", errUploadBody, io.ErrUnexpectedEOF), 400},
		{syscall.ENOSPC, 413}, {syscall.EDQUOT, 413}, {syscall.EFBIG, 413},
		{syscall.EBUSY, 409}, {syscall.ENOTEMPTY, 409},
		{syscall.EIO, 500},
	} {
		rec := httptest.NewRecorder()
		writeFSError(rec, errKindWriteError, "/p", fmt.Errorf("op: %w", c.err))
		if rec.Code != c.want {
			t.Errorf("%v: %d, want %d", c.err, rec.Code, c.want)
		}
	}
}

package mounts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
)

// s3Config is a mount_config for one S3 mount of srv's bucket at /data.
func s3Config(srv *mountstest.S3, bucket, extra string) []byte {
	return fmt.Appendf(nil, `{"auth":{"aws":{"access_key_id":{"type":"opaque","value":%q},"secret_access_key":{"type":"opaque","value":%q}}},
		"mounts":[{"id":"d","type":"s3","mount_path":"/data","s3":{"endpoint_url":%q,"bucket":%q,"path_style":true}%s}]}`,
		srv.AccessKey, srv.SecretKey, srv.Endpoint, bucket, extra)
}

// upS3 serves cfg for a sandbox and returns the host directory of its
// first mount.
func upS3(t *testing.T, cfg []byte) (*Service, string) {
	t.Helper()
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	binds, err := svc.Up(context.Background(), "sb1", "ws", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Remove(context.Background(), "sb1") })
	if len(binds) != 1 || binds[0].Target != "/data" {
		t.Fatalf("binds = %+v", binds)
	}
	return svc, binds[0].Source
}

func TestS3MountReadWriteListRename(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "a.txt", []byte("hello"))
	srv.Put(t, "bkt", "dir/b.txt", []byte("bee"))
	svc, mnt := upS3(t, s3Config(srv, "bkt", ""))

	if b, err := os.ReadFile(filepath.Join(mnt, "a.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("read a.txt = %q, %v", b, err)
	}
	if names := list(t, mnt); !slices.Equal(names, []string{"a.txt", "dir"}) {
		t.Fatalf("ls = %v", names)
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "dir", "b.txt")); string(b) != "bee" {
		t.Fatalf("read dir/b.txt = %q", b)
	}
	// A new file is in the bucket once closed (writeback 0).
	if err := os.WriteFile(filepath.Join(mnt, "c.txt"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantObject(t, srv, "c.txt", "one\n")
	// Appends.
	f, err := os.OpenFile(filepath.Join(mnt, "c.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("two\n")
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantObject(t, srv, "c.txt", "one\ntwo\n")
	// Rename of a file and of a directory move their objects.
	if err := os.Rename(filepath.Join(mnt, "c.txt"), filepath.Join(mnt, "d.txt")); err != nil {
		t.Fatal(err)
	}
	wantObject(t, srv, "d.txt", "one\ntwo\n")
	wantNoObject(t, srv, "c.txt")
	if err := os.Rename(filepath.Join(mnt, "dir"), filepath.Join(mnt, "dir2")); err != nil {
		t.Fatal(err)
	}
	wantObject(t, srv, "dir2/b.txt", "bee")
	wantNoObject(t, srv, "dir/b.txt")
	if b, _ := os.ReadFile(filepath.Join(mnt, "dir2", "b.txt")); string(b) != "bee" {
		t.Fatalf("read dir2/b.txt = %q", b)
	}
	// mkdir, unlink, rmdir.
	if err := os.Mkdir(filepath.Join(mnt, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(mnt, "d.txt")); err != nil {
		t.Fatal(err)
	}
	wantNoObject(t, srv, "d.txt")
	if err := os.Remove(filepath.Join(mnt, "dir2")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir of a full directory: %v", err)
	}
	if err := os.Remove(filepath.Join(mnt, "empty")); err != nil {
		t.Fatal(err)
	}
	// Objects written by someone else appear once the listing is stale.
	srv.Put(t, "bkt", "late.txt", []byte("late"))
	time.Sleep(dirTTL + time.Second)
	if b, err := os.ReadFile(filepath.Join(mnt, "late.txt")); err != nil || string(b) != "late" {
		t.Fatalf("read late.txt = %q, %v", b, err)
	}
	if h := svc.Health("sb1"); h != "mounts: /data (s3) ok" {
		t.Fatalf("health = %q", h)
	}
}

// TestS3MountTools runs tar, git and sqlite3 on mounts: POSIX enough for
// what agents do.
func TestS3MountTools(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	_, mnt := upS3(t, s3Config(srv, "bkt", ""))
	src := t.TempDir()
	for _, p := range []string{"pkg/__init__.py", "pkg/sub/mod.py", "README"} {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte("# "+p+"\n"), 0o644)
	}
	tarball := filepath.Join(t.TempDir(), "y.tar")
	run(t, "", "tar", "-C", src, "-cf", tarball, ".")
	run(t, "", "tar", "-C", mnt, "-xf", tarball)
	wantObject(t, srv, "pkg/sub/mod.py", "# pkg/sub/mod.py\n")
	// What pip install -t and every import do: byte-compile through a
	// temporary file renamed into __pycache__, then import from the mount.
	run(t, "", "python3", "-m", "compileall", "-q", filepath.Join(mnt, "pkg"))
	if out := run(t, mnt, "python3", "-c", "import sys; sys.path.insert(0, '.'); import pkg.sub.mod; print(pkg.sub.mod.__cached__)"); !strings.Contains(out, "__pycache__") {
		t.Fatalf("import from the mount: %q", out)
	}
	if names := list(t, filepath.Join(mnt, "pkg", "sub", "__pycache__")); len(names) != 1 || !strings.HasPrefix(names[0], "mod.") {
		t.Fatalf("__pycache__ = %v", names)
	}
	repo := filepath.Join(mnt, "repo")
	os.Mkdir(repo, 0o755)
	run(t, repo, "git", "init", "-q")
	os.WriteFile(filepath.Join(repo, "f"), []byte("x"), 0o644)
	run(t, repo, "git", "add", "f")
	run(t, repo, "git", "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "m")
	if out := run(t, repo, "git", "status", "--porcelain"); out != "" {
		t.Fatalf("git status after commit: %q", out)
	}
	// sqlite3 reads a database from a read-only mount.
	db := filepath.Join(t.TempDir(), "t.db")
	run(t, "", "sqlite3", db, "create table t(x); insert into t values (42);")
	b, _ := os.ReadFile(db)
	srv.Put(t, "bkt", "t.db", b)
	_, ro := upS3Named(t, "sb2", s3Config(srv, "bkt", `,"read_only":true`))
	if out := run(t, "", "sqlite3", "file:"+filepath.Join(ro, "t.db")+"?mode=ro", "select x from t"); out != "42" {
		t.Fatalf("sqlite3 on a read-only mount = %q", out)
	}
}

func TestS3MountReadOnly(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "a.txt", []byte("hello"))
	_, mnt := upS3(t, s3Config(srv, "bkt", `,"read_only":true`))
	if b, err := os.ReadFile(filepath.Join(mnt, "a.txt")); err != nil || string(b) != "hello" {
		t.Fatalf("read = %q, %v", b, err)
	}
	for what, err := range map[string]error{
		"create": os.WriteFile(filepath.Join(mnt, "new"), []byte("x"), 0o644),
		"write":  os.WriteFile(filepath.Join(mnt, "a.txt"), []byte("x"), 0o644),
		"mkdir":  os.Mkdir(filepath.Join(mnt, "d"), 0o755),
		"unlink": os.Remove(filepath.Join(mnt, "a.txt")),
	} {
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("%s on a read-only mount: %v, want EROFS", what, err)
		}
	}
	wantObject(t, srv, "a.txt", "hello")
}

func TestS3MountWriteback(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	_, mnt := upS3(t, s3Config(srv, "bkt", `,"cache":{"writeback_seconds":2}`))
	start := time.Now()
	if err := os.WriteFile(filepath.Join(mnt, "w.txt"), []byte("later"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := srv.Get(t, "bkt", "w.txt"); ok {
		t.Fatal("w.txt in the bucket before writeback_seconds")
	}
	// The file reads back at once from the cache.
	if b, _ := os.ReadFile(filepath.Join(mnt, "w.txt")); string(b) != "later" {
		t.Fatalf("read back = %q", b)
	}
	wantObject(t, srv, "w.txt", "later")
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("uploaded after %s, before writeback_seconds", d)
	}
}

// TestS3MountWrongKey: a wrong secret fails Up with the store's answer.
func TestS3MountWrongKey(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	bad := *srv
	bad.SecretKey = "not-the-secret"
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.Up(context.Background(), "sb1", "ws", s3Config(&bad, "bkt", ""), nil)
	if err == nil || !errors.Is(err, errDenied) || !strings.Contains(err.Error(), "SignatureDoesNotMatch") {
		t.Fatalf("Up with a wrong key: %v", err)
	}
	if _, err := os.Stat(filepath.Join(svc.opt.Dir, "sb1")); !os.IsNotExist(err) {
		t.Fatalf("a failed Up left its directory: %v", err)
	}
}

// TestS3MountLargeFile streams a 1 GiB file both ways (about 15 s here).
func TestS3MountLargeFile(t *testing.T) {
	size := int64(1 << 30)
	srv := mountstest.StartS3(t, "bkt")
	cfg := s3Config(srv, "bkt", "")
	svc, mnt := upS3(t, cfg)
	f, err := os.Create(filepath.Join(mnt, "big"))
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(pattern{}, size)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	want := h.Sum(nil)
	if got := sha256File(t, filepath.Join(srv.Root, "bkt", "big")); !bytes.Equal(got, want) {
		t.Fatal("object differs from what was written")
	}
	// Served afresh (empty cache), the file streams back from the store.
	binds, err := svc.Up(context.Background(), "sb1", "ws", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := sha256File(t, filepath.Join(binds[0].Source, "big")); !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
}

// pattern is an endless, non-repeating-per-block byte stream.
type pattern struct{}

func (pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(i*7 + i>>9)
	}
	return len(b), nil
}

func upS3Named(t *testing.T, id string, cfg []byte) (*Service, string) {
	t.Helper()
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	binds, err := svc.Up(context.Background(), id, "ws", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Remove(context.Background(), id) })
	return svc, binds[0].Source
}

func sha256File(t *testing.T, p string) []byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return h.Sum(nil)
}

func list(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// wantObject waits (for write-back) until key holds want.
func wantObject(t *testing.T, srv *mountstest.S3, key, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, ok := srv.Get(t, "bkt", key)
		if ok && string(b) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("object %s = %q (present %v), want %q", key, b, ok, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func wantNoObject(t *testing.T, srv *mountstest.S3, key string) {
	t.Helper()
	if _, ok := srv.Get(t, "bkt", key); ok {
		t.Fatalf("object %s still in the bucket", key)
	}
}

// TestS3MountOutage: with the store gone, a read of an uncached file fails
// with EIO at once (no hung process), cached files still read, and the
// mount's health says what failed.
func TestS3MountOutage(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "cached", []byte("here"))
	srv.Put(t, "bkt", "remote", []byte("there"))
	svc, mnt := upS3(t, s3Config(srv, "bkt", ""))
	if b, _ := os.ReadFile(filepath.Join(mnt, "cached")); string(b) != "here" {
		t.Fatalf("read = %q", b)
	}
	srv.Stop()
	start := time.Now()
	_, err := os.ReadFile(filepath.Join(mnt, "remote"))
	if !errors.Is(err, syscall.EIO) || time.Since(start) > 20*time.Second {
		t.Fatalf("read with the store down: %v after %s, want EIO promptly", err, time.Since(start))
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "cached")); err != nil || string(b) != "here" {
		t.Fatalf("cached read with the store down = %q, %v", b, err)
	}
	if h := svc.Health("sb1"); !strings.Contains(h, "/data (s3) degraded: s3 get remote") {
		t.Fatalf("health = %q", h)
	}
}

// TestS3MountCacheSize: clean cached files beyond max_size_bytes are
// evicted, least recently used first, and read back from the store.
func TestS3MountCacheSize(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	blob := bytes.Repeat([]byte("x"), 700<<10)
	srv.Put(t, "bkt", "one", blob)
	srv.Put(t, "bkt", "two", blob)
	svc, mnt := upS3(t, s3Config(srv, "bkt", `,"cache":{"max_size_bytes":1048576}`))
	cacheDir := filepath.Join(svc.opt.Dir, "sb1", "0", "cache")
	for _, name := range []string{"one", "two"} {
		if b, err := os.ReadFile(filepath.Join(mnt, name)); err != nil || len(b) != len(blob) {
			t.Fatalf("read %s: %d bytes, %v", name, len(b), err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		var total int64
		es, _ := os.ReadDir(cacheDir)
		for _, e := range es {
			if fi, err := e.Info(); err == nil {
				total += fi.Size()
			}
		}
		if total <= 1<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cache holds %d bytes over its 1 MiB", total)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "one")); err != nil || !bytes.Equal(b, blob) {
		t.Fatalf("evicted file read back: %d bytes, %v", len(b), err)
	}
}

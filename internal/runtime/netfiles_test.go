package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func readIn(t *testing.T, rootfs, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(rootfs, p))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteNetFilesKeepsEditsAndRefreshesTheRest(t *testing.T) {
	rootfs := t.TempDir()
	ctx := context.Background()
	os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755)
	// The image's own files are replaced on the first boot.
	os.WriteFile(filepath.Join(rootfs, "etc/hosts"), []byte("127.0.0.1 image\n"), 0o644)
	os.Symlink("/run/systemd/resolve/stub-resolv.conf", filepath.Join(rootfs, "etc/resolv.conf"))
	if err := WriteNetFiles(ctx, rootfs, "parent", []byte("nameserver 10.0.0.1\n")); err != nil {
		t.Fatal(err)
	}
	if got := readIn(t, rootfs, HostsPath); got != string(HostsFile("parent")) {
		t.Errorf("hosts = %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(rootfs, ResolvPath)); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o644 {
		t.Fatalf("resolv.conf: %v, %v", fi, err)
	}
	// Root inside edits resolv.conf; a branch boots with a new hostname and
	// the host's nameservers changed: hosts follows, resolv.conf is kept.
	os.WriteFile(filepath.Join(rootfs, "etc/resolv.conf"), []byte("nameserver 9.9.9.9\n"), 0o644)
	if err := WriteNetFiles(ctx, rootfs, "branch", []byte("nameserver 10.0.0.2\n")); err != nil {
		t.Fatal(err)
	}
	if got := readIn(t, rootfs, HostsPath); !strings.Contains(got, "branch") {
		t.Errorf("unedited hosts not refreshed: %q", got)
	}
	if got := readIn(t, rootfs, ResolvPath); got != "nameserver 9.9.9.9\n" {
		t.Errorf("edited resolv.conf overwritten: %q", got)
	}
	// Deleting a file hands it back to Cubicle.
	os.Remove(filepath.Join(rootfs, "etc/resolv.conf"))
	if err := WriteNetFiles(ctx, rootfs, "branch", []byte("nameserver 10.0.0.3\n")); err != nil {
		t.Fatal(err)
	}
	if got := readIn(t, rootfs, ResolvPath); got != "nameserver 10.0.0.3\n" {
		t.Errorf("deleted resolv.conf not regenerated: %q", got)
	}
}

func TestWriteNetFilesHostileTree(t *testing.T) {
	base := t.TempDir()
	rootfs := filepath.Join(base, "rootfs")
	host := filepath.Join(base, "host-file")
	os.WriteFile(host, []byte("host\n"), 0o644)
	os.MkdirAll(filepath.Join(rootfs, "etc/cubicle"), 0o755)
	// Never generated before: a symlink out and a FIFO are replaced, never
	// followed or opened.
	os.Symlink(host, filepath.Join(rootfs, "etc/hosts"))
	unix.Mkfifo(filepath.Join(rootfs, "etc/resolv.conf"), 0o644)
	unix.Mkfifo(filepath.Join(rootfs, "etc/cubicle/netfiles.sha256"), 0o644)
	done := make(chan error, 1)
	go func() { done <- WriteNetFiles(context.Background(), rootfs, "h", []byte("nameserver 10.0.0.1\n")) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("WriteNetFiles blocked on a FIFO")
	}
	if b, _ := os.ReadFile(host); string(b) != "host\n" {
		t.Errorf("host file written: %q", b)
	}
	for _, p := range []string{HostsPath, ResolvPath, NetFilesRecord} {
		if fi, err := os.Lstat(filepath.Join(rootfs, p)); err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v, %v; want a regular file", p, fi, err)
		}
	}
	// Generated before, then made a FIFO inside: the sandbox's choice, kept.
	os.Remove(filepath.Join(rootfs, "etc/hosts"))
	unix.Mkfifo(filepath.Join(rootfs, "etc/hosts"), 0o644)
	go func() { done <- WriteNetFiles(context.Background(), rootfs, "h", []byte("nameserver 10.0.0.1\n")) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("WriteNetFiles blocked on a FIFO")
	}
	if fi, _ := os.Lstat(filepath.Join(rootfs, "etc/hosts")); fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("edited (FIFO) hosts replaced: %v", fi.Mode())
	}
	// A directory in the way, record or not, is kept and the boot goes on.
	os.Remove(filepath.Join(rootfs, NetFilesRecord))
	os.Remove(filepath.Join(rootfs, "etc/hosts"))
	os.MkdirAll(filepath.Join(rootfs, "etc/hosts/sub"), 0o755)
	if err := WriteNetFiles(context.Background(), rootfs, "h", []byte("nameserver 10.0.0.1\n")); err != nil {
		t.Fatalf("directory at /etc/hosts: %v", err)
	}
}

// TestResolvConf: one resolv.conf for every driver, from the host's: only
// nameservers a sandbox can reach (loopback and unspecified ones are in
// the host's namespace), at most three, else public fallbacks; the last
// search line and every options line.
func TestResolvConf(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ host, want string }{
		{"nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lan\n", "nameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch lan\noptions edns0 trust-ad\n"},
		{"# c\nnameserver 10.0.0.2\nnameserver ::1\nnameserver 0.0.0.0\nnameserver 2001:db8::1\n", "nameserver 10.0.0.2\nnameserver 2001:db8::1\n"},
		{"nameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\nnameserver 10.0.0.4\n", "nameserver 10.0.0.1\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n"},
		{"search a\nnameserver bogus\nsearch b c\noptions ndots:2\noptions rotate\n", "nameserver 1.1.1.1\nnameserver 8.8.8.8\nsearch b c\noptions ndots:2\noptions rotate\n"},
		{"", "nameserver 1.1.1.1\nnameserver 8.8.8.8\n"},
	} {
		p := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(p, []byte(c.host), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ResolvConf(p)
		if err != nil || string(got) != c.want {
			t.Errorf("ResolvConf(%q) = %q, %v; want %q", c.host, got, err, c.want)
		}
	}
	if got, err := ResolvConf(filepath.Join(dir, "missing")); err != nil || string(got) != "nameserver 1.1.1.1\nnameserver 8.8.8.8\n" {
		t.Errorf("missing host file: %q, %v", got, err)
	}
	if _, err := ResolvConf(dir); err == nil {
		t.Error("an unreadable host resolv.conf (a directory) gave no error")
	}
}

package proxy

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func trustService(t *testing.T) *Service {
	t.Helper()
	ca, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &Service{ca: ca, log: slog.New(slog.DiscardHandler)}
}

// A sandbox can plant anything at its system CA bundle's path; the next
// boot must neither read it unbounded (a 100 GiB sparse file used to OOM
// the daemon) nor block on it (a FIFO wedged the boot), and still install
// the CA at the Cubicle paths.
func TestPrepareRootFSHostileSystemBundle(t *testing.T) {
	const debian = "/etc/ssl/certs/ca-certificates.crt"
	plant := map[string]func(p string) error{
		"sparse-100G": func(p string) error {
			f, err := os.Create(p)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Truncate(100 << 30)
		},
		"fifo":    func(p string) error { return unix.Mkfifo(p, 0o644) },
		"symlink": func(p string) error { return os.Symlink("/proc/self/environ", p) },
	}
	for name, mk := range plant {
		t.Run(name, func(t *testing.T) {
			s := trustService(t)
			rootfs := t.TempDir()
			p := filepath.Join(rootfs, debian)
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := mk(p); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { _, err := s.PrepareRootFS(context.Background(), rootfs); done <- err }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("PrepareRootFS: %v", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("PrepareRootFS blocked")
			}
			ca := s.ca.CertPEM()
			for _, f := range []string{SandboxCAFile, SandboxBundle} {
				if b, err := os.ReadFile(filepath.Join(rootfs, f)); err != nil || !bytes.Equal(b, ca) {
					t.Errorf("%s = %d bytes, %v; want the CA", f, len(b), err)
				}
			}
			if fi, err := os.Lstat(p); err != nil || (name == "sparse-100G" && fi.Size() != 100<<30) {
				t.Errorf("planted bundle changed: %v, %v", fi, err)
			}
		})
	}
}

func TestPrepareRootFSAppendsToSystemBundle(t *testing.T) {
	s := trustService(t)
	rootfs := t.TempDir()
	p := filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt")
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("PUBLIC ROOTS\n"), 0o644)
	for range 2 { // idempotent
		if _, err := s.PrepareRootFS(context.Background(), rootfs); err != nil {
			t.Fatal(err)
		}
	}
	want := append([]byte("PUBLIC ROOTS\n"), s.ca.CertPEM()...)
	for _, f := range []string{p, filepath.Join(rootfs, SandboxBundle)} {
		if b, _ := os.ReadFile(f); !bytes.Equal(b, want) {
			t.Errorf("%s = %q", f, b)
		}
	}
}

// A directory planted at a Cubicle CA path costs the sandbox its CA, not
// its boot.
func TestPrepareRootFSDirectoryInTheWay(t *testing.T) {
	s := trustService(t)
	rootfs := t.TempDir()
	os.MkdirAll(filepath.Join(rootfs, SandboxCAFile, "x"), 0o755)
	if _, err := s.PrepareRootFS(context.Background(), rootfs); err != nil {
		t.Fatalf("PrepareRootFS: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, SandboxBundle)); err != nil || !bytes.Equal(b, s.ca.CertPEM()) {
		t.Errorf("bundle = %q, %v", b, err)
	}
}

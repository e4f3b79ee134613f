package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// Paths inside a sandbox's root filesystem.
const (
	// SandboxCAFile is the CA alone (Debian's update-ca-certificates
	// picks it up; Node's NODE_EXTRA_CA_CERTS adds it).
	SandboxCAFile = "/usr/local/share/ca-certificates/cubicle-egress.crt"
	// SandboxBundle is the image's bundle plus the CA: SSL_CERT_FILE and
	// REQUESTS_CA_BUNDLE replace the default bundle, so they must keep the
	// public roots for connections the proxy does not intercept.
	SandboxBundle = "/etc/cubicle/ca-bundle.crt"
)

// systemBundles are where images keep their CA bundle, first match wins.
var systemBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, busybox images with certs
	"/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL
	"/etc/ssl/cert.pem",                  // Alpine, macOS-like layouts
}

// TrustEnv is the environment that makes common TLS stacks trust the CA.
func TrustEnv() []string {
	return []string{
		"SSL_CERT_FILE=" + SandboxBundle,
		"REQUESTS_CA_BUNDLE=" + SandboxBundle,
		"CURL_CA_BUNDLE=" + SandboxBundle,
		"NODE_EXTRA_CA_CERTS=" + SandboxCAFile,
	}
}

// PrepareRootFS makes the sandbox whose root filesystem is mounted at
// rootfs trust the CA: it writes SandboxCAFile and SandboxBundle and appends
// the CA to the image's system bundle when there is one. It runs before the
// sandbox starts, as root on the host, over a tree the sandbox may have
// written on an earlier run: every access goes through os.Root, so a
// symlink planted inside cannot redirect a write to the host. Idempotent.
// It returns the environment to give the sandbox's processes.
func (s *Service) PrepareRootFS(ctx context.Context, rootfs string) ([]string, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("proxy: open rootfs: %w", err)
	}
	defer root.Close()
	ca := s.ca.CertPEM()
	if err := writeIn(root, SandboxCAFile, ca); err != nil {
		return nil, err
	}
	var bundle []byte
	for _, p := range systemBundles {
		b, err := root.ReadFile(rel(p))
		if err != nil {
			continue
		}
		if !bytes.Contains(b, bytes.TrimSpace(ca)) {
			b = append(append(bytes.TrimRight(b, "\n"), '\n'), ca...)
			if err := writeIn(root, p, b); err != nil {
				return nil, err
			}
		}
		bundle = b
		break
	}
	if bundle == nil {
		bundle = ca
	}
	if err := writeIn(root, SandboxBundle, bundle); err != nil {
		return nil, err
	}
	return TrustEnv(), nil
}

// writeIn replaces the file at the absolute in-sandbox path p under root.
// A symlink at p is replaced, not followed.
func writeIn(root *os.Root, p string, data []byte) error {
	r := rel(p)
	if err := root.MkdirAll(dirOf(r), 0o755); err != nil {
		return fmt.Errorf("proxy: mkdir for %s in sandbox: %w", p, err)
	}
	if fi, err := root.Lstat(r); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if err := root.Remove(r); err != nil {
			return fmt.Errorf("proxy: replace symlink %s in sandbox: %w", p, err)
		}
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("proxy: stat %s in sandbox: %w", p, err)
	}
	if err := root.WriteFile(r, data, 0o644); err != nil {
		return fmt.Errorf("proxy: write %s in sandbox: %w", p, err)
	}
	return nil
}

func rel(p string) string { return p[1:] }

func dirOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "."
}

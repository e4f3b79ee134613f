package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/cubicle-dev/cubicle/internal/sandboxfs"
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

// maxSystemBundle caps the image's CA bundle the daemon reads at boot
// (Debian's is about 220 KB): a bigger one, or one that is not a regular
// file, is the sandbox's doing and is skipped, not read.
const maxSystemBundle = 8 << 20

// PrepareRootFS makes the sandbox whose root filesystem is mounted at
// rootfs trust the CA: it writes SandboxCAFile and SandboxBundle and appends
// the CA to the image's system bundle when there is one. It runs before the
// sandbox starts, as root on the host, over a tree the sandbox may have
// written on an earlier run, so every access goes through sandboxfs.
// Whatever the sandbox did to these paths (a FIFO or a 100 GiB sparse file
// as its system bundle, a directory in the way) costs it only its trust in
// the CA — logged, and failing closed: TLS the proxy intercepts is then
// refused inside — never its boot. Idempotent; writes nothing when nothing
// changed. It returns the environment to give the sandbox's processes.
func (s *Service) PrepareRootFS(ctx context.Context, rootfs string) ([]string, error) {
	tree, err := sandboxfs.OpenTree(rootfs)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	defer tree.Close()
	ca := s.ca.CertPEM()
	s.install(ctx, tree, rootfs, SandboxCAFile, ca)
	bundle := ca
	for _, p := range systemBundles {
		b, err := tree.ReadFile(ctx, p, maxSystemBundle)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue
		}
		if err != nil {
			s.log.Warn("skipping the sandbox's system CA bundle", "rootfs", rootfs, "err", err)
			continue
		}
		if !bytes.Contains(b, bytes.TrimSpace(ca)) {
			b = append(append(bytes.TrimRight(b, "\n"), '\n'), ca...)
			s.install(ctx, tree, rootfs, p, b)
		}
		bundle = b
		break
	}
	s.install(ctx, tree, rootfs, SandboxBundle, bundle)
	return TrustEnv(), nil
}

// install writes data at p in tree, logging (not returning) a failure.
func (s *Service) install(ctx context.Context, tree *sandboxfs.Tree, rootfs, p string, data []byte) {
	if err := tree.WriteFile(ctx, p, data, 0o644); err != nil {
		s.log.Warn("could not install the egress CA in the sandbox", "rootfs", rootfs, "err", err)
	}
}

package mounts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/awssts"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// SecretSource resolves workspace secrets (internal/secrets.Vault).
type SecretSource interface {
	Secret(ctx context.Context, workspaceID, name string) ([]byte, error)
	// MayUse returns nil if p may have a mount use secret name.
	MayUse(ctx context.Context, p auth.Principal, name string) error
}

// Options configure a Service.
type Options struct {
	// Dir holds every sandbox's mount points, caches and clones
	// (<data-dir>/mounts); it is the daemon's alone.
	Dir string
	// Secrets resolves workspace_secret credentials; nil refuses them.
	Secrets SecretSource
	// ExtraRootsPEM are CAs trusted for the stores' and remotes' TLS
	// besides the host's (--egress-ca-file).
	ExtraRootsPEM []byte
	// Forbidden are address ranges the daemon never dials for a mount
	// (the sandbox pool); link-local (cloud metadata) always is, and
	// loopback (the daemon's own host) unless AllowLoopback.
	Forbidden     []netip.Prefix
	AllowLoopback bool
	// GCSEndpoint replaces https://storage.googleapis.com (tests).
	GCSEndpoint string
	// PartSize is the size above which S3 uploads go multipart, and of
	// their parts (default 64 MiB, at least 5 MiB).
	PartSize int64
	// STSEndpoint replaces the regional AWS STS endpoint auth.aws.role_arn
	// roles are assumed through (the egress proxy's, --egress-sts-endpoint).
	STSEndpoint string
	Logger      *slog.Logger
}

// Service serves the data mounts of every sandbox. A sandbox's mounts are
// up between Up and Down; Up is idempotent (a second Up serves afresh).
type Service struct {
	opt   Options
	hc    *http.Client
	roots string // CA bundle file for git (host roots + extras)

	mu   sync.Mutex
	byID map[string]*served
}

// served is one sandbox's running mounts.
type served struct {
	mounts []*live
}

// live is one mount being served.
type live struct {
	spec   Mount
	server *fuse.Server // bucket mounts
	fsys   *bucketFS
	root   *node
	mnt    string   // the FUSE mount point
	repo   *gitRepo // git mounts
}

// New makes a Service; nothing is mounted until Up.
func New(opt Options) (*Service, error) {
	if opt.PartSize == 0 {
		opt.PartSize = defaultPartSize
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if err := os.MkdirAll(opt.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("mounts dir: %w", err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if len(opt.ExtraRootsPEM) > 0 && !pool.AppendCertsFromPEM(opt.ExtraRootsPEM) {
		return nil, errors.New("mounts: extra CA file holds no certificate")
	}
	s := &Service{opt: opt, byID: map[string]*served{}}
	if s.roots, err = writeRoots(opt.Dir, opt.ExtraRootsPEM); err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: s.checkDial}
	s.hc = &http.Client{Transport: &http.Transport{
		DialContext: dialer.DialContext, TLSClientConfig: &tls.Config{RootCAs: pool},
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: callTimeout,
		MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second, ForceAttemptHTTP2: true,
	}}
	return s, nil
}

// writeRoots writes the host's CA bundle plus extra as the file git trusts.
func writeRoots(dir string, extra []byte) (string, error) {
	var host []byte
	for _, p := range []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"} {
		if b, err := os.ReadFile(p); err == nil {
			host = b
			break
		}
	}
	p := filepath.Join(dir, "ca-bundle.pem")
	if err := os.WriteFile(p, append(append(host, '\n'), extra...), 0o600); err != nil {
		return "", fmt.Errorf("mounts CA bundle: %w", err)
	}
	return p, nil
}

// checkDial refuses what checkAddr does: an endpoint_url is the tenant's
// choice, and must not reach cloud metadata, the host or sandboxes.
func (s *Service) checkDial(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	return s.checkAddr(a)
}

func (s *Service) checkAddr(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsUnspecified():
		return fmt.Errorf("mount endpoints may not be link-local or unspecified (%s)", a)
	case a.IsLoopback() && !s.opt.AllowLoopback:
		return fmt.Errorf("mount endpoints may not be loopback (%s) unless the daemon runs with --mounts-allow-loopback", a)
	}
	for _, p := range s.opt.Forbidden {
		if p.Contains(a) {
			return fmt.Errorf("mount endpoints may not be in %s (%s)", p, a)
		}
	}
	return nil
}

// checkHost resolves host (a git remote's, which git dials itself),
// refuses it if any of its addresses is one checkAddr refuses, and
// returns the one git is pinned to (so a later answer cannot differ).
func (s *Service) checkHost(ctx context.Context, host string) (netip.Addr, error) {
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("resolve %s: %v", host, err)
	}
	for _, a := range addrs {
		if err := s.checkAddr(a); err != nil {
			return netip.Addr{}, err
		}
	}
	return addrs[0].Unmap(), nil
}

// Validate checks raw mount_config for principal p: its shape (422 naming
// the field) and p's right to every workspace secret it names.
func (s *Service) Validate(ctx context.Context, p auth.Principal, raw, proxyConfig []byte) ([]string, error) {
	cfg, err := Parse(raw, proxyConfig)
	if err != nil {
		return nil, err
	}
	for _, name := range cfg.SecretNames() {
		if s.opt.Secrets == nil {
			return nil, errdefs.Field("mount_config.auth", "workspace secrets are not configured on this server")
		}
		if err := s.opt.Secrets.MayUse(ctx, p, name); err != nil {
			return nil, fmt.Errorf("mount_config.auth: %w", err)
		}
	}
	paths := make([]string, len(cfg.Mounts))
	for i, m := range cfg.Mounts {
		paths[i] = m.Path
	}
	return paths, nil
}

// Up serves sandbox id's mounts and returns the binds its runtime makes.
// A mount that cannot be served (a wrong key, a missing bucket, a remote
// that cannot be cloned) fails Up with what the store said; nothing of
// this Up is left behind then. Mounts already served for id are taken
// down first.
func (s *Service) Up(ctx context.Context, id, workspace string, raw, proxyConfig []byte) (_ []runtime.Mount, err error) {
	cfg, err := Parse(raw, proxyConfig)
	if err != nil {
		return nil, err
	}
	if err := s.Down(ctx, id); err != nil {
		return nil, err
	}
	sv := &served{}
	defer func() {
		if err != nil { // nothing of a failed Up stays but writes still pending
			s.stop(context.WithoutCancel(ctx), sv)
			s.discard(id)
		}
	}()
	var binds []runtime.Mount
	for i, m := range cfg.Mounts {
		dir := filepath.Join(s.opt.Dir, id, strconv.Itoa(i))
		l, src, err := s.serve(ctx, id, workspace, cfg, m, dir)
		if err != nil {
			return nil, fmt.Errorf("mount %q at %s: %w", m.ID, m.Path, err)
		}
		sv.mounts = append(sv.mounts, l)
		binds = append(binds, runtime.Mount{Source: src, Target: m.Path, ReadOnly: m.ReadOnly})
	}
	s.mu.Lock()
	s.byID[id] = sv
	s.mu.Unlock()
	return binds, nil
}

// discard removes sandbox id's mount directories, keeping those whose
// journal still names writes a previous daemon left pending (their upload
// failed; the next Up tries again).
func (s *Service) discard(id string) {
	top := filepath.Join(s.opt.Dir, id)
	entries, _ := os.ReadDir(top)
	for _, e := range entries {
		if d := filepath.Join(top, e.Name()); !hasPending(d) {
			os.RemoveAll(d)
		}
	}
	os.Remove(top) // only if empty
}

// serve brings up sandbox id's mount m under dir and returns it and its
// bind source.
func (s *Service) serve(ctx context.Context, id, workspace string, cfg *Config, m Mount, dir string) (*live, string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	if m.Type == TypeGit {
		repo, err := s.cloneGit(ctx, m, filepath.Join(dir, "repo"))
		if err != nil {
			return nil, "", err
		}
		return &live{spec: m, repo: repo}, repo.dir, nil
	}
	be, err := s.backend(ctx, id, workspace, cfg, m)
	if err != nil {
		return nil, "", err
	}
	// A probe: a wrong key or a missing bucket fails the boot with the
	// store's answer instead of leaving a mount that fails every call.
	if _, _, err := be.List(ctx, "\x00probe/"); err != nil {
		return nil, "", fmt.Errorf("reach %s bucket: %w", m.Type, err)
	}
	cache, journal, mnt := filepath.Join(dir, "cache"), filepath.Join(dir, "journal"), filepath.Join(dir, "mnt")
	detach(mnt) // a previous daemon's mount, dead with it
	if err := replayJournal(ctx, be, dir, s.opt.Logger.With("mount", m.ID)); err != nil {
		return nil, "", err
	}
	if err := os.RemoveAll(cache); err != nil {
		return nil, "", err
	}
	for _, d := range []string{cache, journal, mnt} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, "", err
		}
	}
	fsys := &bucketFS{be: be, cacheDir: cache, journalDir: journal, maxCache: m.Cache.MaxSizeBytes, writeback: time.Duration(m.Cache.WritebackSeconds) * time.Second,
		readOnly: m.ReadOnly, log: s.opt.Logger.With("mount", m.ID, "path", m.Path), lru: map[*node]time.Time{}}
	root := fsys.newNode(true, 0, time.Now(), true)
	sec := time.Second
	// Negative entries are cached too: a name this mount lacks is one the
	// store lacked a moment ago (creates through the mount replace them).
	opts := &fs.Options{EntryTimeout: &sec, AttrTimeout: &sec, NegativeTimeout: &sec, MountOptions: fuse.MountOptions{
		AllowOther: true, FsName: m.Type + ":" + bucketName(m), Name: "cubicle", DirectMountStrict: true,
		MaxWrite: 1 << 20, IDMappedMount: true, DisableXAttrs: true,
	}}
	if m.ReadOnly {
		opts.MountOptions.Options = append(opts.MountOptions.Options, "ro")
	}
	server, err := fs.Mount(mnt, root, opts)
	if err != nil {
		return nil, "", fmt.Errorf("fuse mount: %w", err)
	}
	return &live{spec: m, server: server, fsys: fsys, root: root, mnt: mnt}, mnt, nil
}

func bucketName(m Mount) string {
	if m.S3 != nil {
		return m.S3.Bucket
	}
	return m.GCS.Bucket
}

// backend builds the store client for sandbox id's bucket mount m with its
// credentials.
func (s *Service) backend(ctx context.Context, id, workspace string, cfg *Config, m Mount) (Backend, error) {
	switch m.Type {
	case TypeS3:
		a := cfg.Auth.AWS
		if a.RoleARN != "" {
			return newS3Backend(m.S3, s.roleCredentials(id, workspace, a, m.S3.Region), s.hc, s.opt.PartSize), nil
		}
		ak, err := s.secret(ctx, workspace, a.AccessKeyID)
		if err != nil {
			return nil, fmt.Errorf("%s.access_key_id: %w", a.From, err)
		}
		sk, err := s.secret(ctx, workspace, a.SecretAccessKey)
		if err != nil {
			return nil, fmt.Errorf("%s.secret_access_key: %w", a.From, err)
		}
		return newS3Backend(m.S3, credentials.NewStaticCredentialsProvider(ak, sk, ""), s.hc, s.opt.PartSize), nil
	case TypeGCS:
		key, err := s.secret(ctx, workspace, cfg.Auth.GCP.ServiceAccountJSON)
		if err != nil {
			return nil, fmt.Errorf("mount_config.auth.gcp.service_account_json: %w", err)
		}
		return newGCSBackend(ctx, m.GCS, []byte(key), s.opt.GCSEndpoint, s.hc)
	}
	return nil, fmt.Errorf("mount type %s has no backend", m.Type)
}

// roleCredentials are temporary credentials for a's role, assumed through
// STS (signed for region) with workspace's base keys on behalf of sandbox
// id, and assumed again awssts.RenewBefore ahead of their expiry. The base
// keys are read from the workspace's secrets at each renewal, so a rotated
// key is picked up.
func (s *Service) roleCredentials(id, workspace string, a *AWSAuth, region string) aws.CredentialsProvider {
	endpoint, signing := awssts.Endpoint(s.opt.STSEndpoint, region)
	body := awssts.Role{ARN: a.RoleARN, SessionName: "cubicle-" + id, ExternalID: workspace, Tags: a.SessionTags}.Form()
	assume := func(ctx context.Context) (aws.Credentials, error) {
		ak, err := s.secret(ctx, workspace, Secret{Type: "workspace_secret", Value: awssts.BaseAccessKeySecret})
		if err != nil {
			return aws.Credentials{}, fmt.Errorf("%s.role_arn: base credentials: %w", a.From, err)
		}
		sk, err := s.secret(ctx, workspace, Secret{Type: "workspace_secret", Value: awssts.BaseSecretKeySecret})
		if err != nil {
			return aws.Credentials{}, fmt.Errorf("%s.role_arn: base credentials: %w", a.From, err)
		}
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		creds, err := awssts.AssumeRole(ctx, s.hc, endpoint, signing, body, aws.Credentials{AccessKeyID: ak, SecretAccessKey: sk})
		if err != nil {
			return aws.Credentials{}, fmt.Errorf("%s.role_arn: assume %s: %w", a.From, a.RoleARN, err)
		}
		return creds, nil
	}
	return aws.NewCredentialsCache(aws.CredentialsProviderFunc(assume), func(o *aws.CredentialsCacheOptions) {
		o.ExpiryWindow = awssts.RenewBefore
	})
}

func (s *Service) secret(ctx context.Context, workspace string, sec Secret) (string, error) {
	if sec.Type != "workspace_secret" {
		return sec.Value, nil
	}
	if s.opt.Secrets == nil {
		return "", errors.New("workspace secrets are not configured")
	}
	v, err := s.opt.Secrets.Secret(ctx, workspace, sec.Value)
	if err != nil {
		return "", fmt.Errorf("workspace secret %s: %w", sec.Value, err)
	}
	return strings.TrimSpace(string(v)), nil
}

// Down stops serving sandbox id's mounts after uploading what is still
// pending write-back. Call it once the sandbox no longer runs. Idempotent.
func (s *Service) Down(ctx context.Context, id string) error {
	s.mu.Lock()
	sv := s.byID[id]
	delete(s.byID, id)
	s.mu.Unlock()
	if sv == nil {
		return nil
	}
	return s.stop(ctx, sv)
}

func (s *Service) stop(ctx context.Context, sv *served) error {
	var errs []error
	for _, l := range sv.mounts {
		if l.repo != nil {
			l.repo.stop()
		}
		if l.server == nil {
			continue
		}
		if err := l.root.flushAll(ctx); err != nil {
			errs = append(errs, fmt.Errorf("mount %q: write back: %w", l.spec.ID, err))
		}
		if err := l.server.Unmount(); err != nil {
			detach(l.mnt) // still busy: the runtime's bind goes with it
		}
		l.server.Wait()
	}
	return errors.Join(errs...)
}

// Remove takes sandbox id's mounts down and deletes their caches and
// clones (the sandbox is being deleted).
func (s *Service) Remove(ctx context.Context, id string) error {
	err := s.Down(ctx, id)
	return errors.Join(err, os.RemoveAll(filepath.Join(s.opt.Dir, id)))
}

// Health describes sandbox id's mounts for its status message: "" when it
// has none, else each mount and whether its last store call worked.
func (s *Service) Health(id string) string {
	s.mu.Lock()
	sv := s.byID[id]
	s.mu.Unlock()
	if sv == nil {
		return ""
	}
	var parts []string
	for _, l := range sv.mounts {
		state := "ok"
		var err error
		if l.fsys != nil {
			err = l.fsys.health()
		} else if l.repo != nil {
			err = l.repo.health()
		}
		if err != nil {
			state = "degraded: " + err.Error()
		}
		parts = append(parts, fmt.Sprintf("%s (%s) %s", l.spec.Path, l.spec.Type, state))
	}
	return "mounts: " + strings.Join(parts, "; ")
}

// Close takes every sandbox's mounts down (daemon shutdown): pending
// writes are uploaded, and the sandboxes' binds go dead until their next
// start.
func (s *Service) Close(ctx context.Context) error {
	s.mu.Lock()
	ids := make([]string, 0, len(s.byID))
	for id := range s.byID {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	var errs []error
	for _, id := range ids {
		errs = append(errs, s.Down(ctx, id))
	}
	return errors.Join(errs...)
}

// detach lazily unmounts p if something is mounted there.
func detach(p string) {
	_ = syscall.Unmount(p, syscall.MNT_DETACH)
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/miekg/dns"
	"github.com/spf13/pflag"

	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/mounts"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/secrets"
)

// egressFlags configure the egress proxy (proxy_config enforcement).
type egressFlags struct {
	listen   string
	caFiles  []string
	resolve  []string
	maxConns int
	// stsEndpoint overrides AWS STS for role_arn rules (tests use a fake).
	stsEndpoint string
}

func addEgressFlags(fl *pflag.FlagSet, f *egressFlags) {
	fl.StringVar(&f.listen, "egress-listen", "0.0.0.0:0",
		"address of the transparent egress proxy; sandboxes reach it only through the redirect of their TCP 80/443 (port 0: any free port)")
	fl.StringSliceVar(&f.caFiles, "egress-ca-file", nil,
		"PEM file of extra CA certificates the egress proxy and data mounts (S3/GCS endpoints, git remotes) trust for upstream TLS, besides the host's (repeatable)")
	fl.IntVar(&f.maxConns, "egress-max-conns-per-sandbox", 512,
		"connections one sandbox may hold open through the egress proxy at once (more are reset)")
	fl.StringVar(&f.stsEndpoint, "egress-sts-endpoint", "",
		"AWS STS endpoint the egress proxy and S3 data mounts assume aws.role_arn roles through (default: the regional STS endpoint of the rule's or mount's region, else https://sts.amazonaws.com)")
	fl.StringSliceVar(&f.resolve, "egress-resolve", nil,
		"NAME=IPv4: resolve NAME to IPv4 in the egress proxy instead of DNS (repeatable; for tests and split-horizon setups)")
}

// newEgress starts the egress proxy and opens the workspace secrets vault.
// The daemon's resolver for proxied sandboxes forwards to hostResolv's
// nameservers.
func newEgress(ctx context.Context, f egressFlags, dataDir, hostResolv string, netmgr *network.Manager, box *secrets.Box, ids *jwtkeys.Signer, meter proxy.Meter,
	rec proxy.Recorder, log *slog.Logger) (*proxy.Service, *secrets.Vault, error) {
	vault, err := secrets.OpenVault(box, filepath.Join(dataDir, "workspace-secrets.json"))
	if err != nil {
		return nil, nil, err
	}
	upstreams, err := upstreamResolvers(hostResolv)
	if err != nil {
		return nil, nil, err
	}
	cfg := proxy.Config{
		Network: netmgr, CADir: filepath.Join(dataDir, "ca"), Listen: f.listen,
		Secrets: vault, Forbidden: []netip.Prefix{netmgr.Pool()}, Logger: log, Meter: meter, Recorder: rec,
		Resolve: map[string]netip.Addr{}, Upstreams: upstreams, MaxConnsPerSandbox: f.maxConns,
		Identity: ids, STSEndpoint: f.stsEndpoint,
	}
	if cfg.ExtraRootsPEM, err = readCAFiles(f.caFiles); err != nil {
		return nil, nil, err
	}
	for _, r := range f.resolve {
		name, ip, ok := strings.Cut(r, "=")
		a, err := netip.ParseAddr(ip)
		if !ok || err != nil || !a.Is4() {
			return nil, nil, fmt.Errorf("--egress-resolve %q: want NAME=IPv4", r)
		}
		cfg.Resolve[strings.ToLower(strings.TrimSuffix(name, "."))] = a
	}
	svc, err := proxy.New(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	return svc, vault, nil
}

// newDataMounts serves mount_config under <data-dir>/mounts, trusting the
// egress proxy's extra CAs for the stores and git remotes too, and never
// dialling the sandbox pool.
func newDataMounts(f serveFlags, vault *secrets.Vault, netmgr *network.Manager, log *slog.Logger) (*mounts.Service, error) {
	roots, err := readCAFiles(f.egress.caFiles)
	if err != nil {
		return nil, err
	}
	return mounts.New(mounts.Options{Dir: filepath.Join(f.dataDir, "mounts"), Secrets: vault, ExtraRootsPEM: roots,
		Forbidden: []netip.Prefix{netmgr.Pool()}, AllowLoopback: f.mountsLoopback, GCSEndpoint: f.gcsEndpoint, STSEndpoint: f.egress.stsEndpoint, Logger: log})
}

// readCAFiles concatenates the PEM files given to --egress-ca-file.
func readCAFiles(paths []string) ([]byte, error) {
	var pem []byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		pem = append(append(pem, b...), '\n')
	}
	return pem, nil
}

// upstreamResolvers are the host:port resolvers of resolv.conf at path,
// loopback ones included (the daemon runs in the host's namespace), or the
// public ones the runtimes fall back to when it names none.
func upstreamResolvers(path string) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var out []string
	if cc != nil {
		for _, s := range cc.Servers {
			out = append(out, net.JoinHostPort(s, cc.Port))
		}
	}
	if len(out) == 0 {
		for _, s := range runtime.FallbackNameservers() {
			out = append(out, net.JoinHostPort(s, "53"))
		}
	}
	return out, nil
}

// watchFlows records the sandboxes' flows that bypass the proxy (raw TCP
// and UDP, from conntrack) until ctx ends or the returned stop is called,
// restarting the watch when it fails (events lost to a full socket). A
// host without conntrack events only logs: the rest of the record works.
func watchFlows(ctx context.Context, netmgr *network.Manager, egress *proxy.Service, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wait := time.Second; ; wait = min(2*wait, time.Minute) {
			err := netmgr.WatchFlows(ctx, egress.RecordFlow)
			if ctx.Err() != nil {
				return
			}
			log.Warn("network flow record: restarting", "err", err, "in", wait)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	}()
	return func() { cancel(); <-done }
}

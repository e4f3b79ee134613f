// Package proxy is the daemon's transparent egress proxy. It enforces a
// sandbox's proxy_config (spec §4.4): access_control by HTTP Host and TLS
// SNI, and header injection and AWS SigV4 signing (credentials) for
// rule-matched hosts by terminating TLS with a per-install CA and
// re-encrypting to the real server.
//
// Traffic arrives by redirect, not by proxy settings: internal/network
// rewrites every sandbox's TCP 80/443 to the proxy's port on the host side
// of its veth, and the proxy learns the real destination from conntrack.
// A sandbox without a proxy_config gets a pass-through: everything
// allowed, nothing intercepted, each connection dialled where the sandbox
// sent it; the proxy is in its path only to record its traffic
// (record.go). A connection is attributed to a sandbox by its source address,
// which the network policy guarantees (anti-spoofing on sandbox veths).
//
// Invariants:
//   - The proxy dials names itself (with the host's resolver); it never
//     trusts the sandbox's choice of IP for a name, so a forged SNI or Host
//     cannot reach an arbitrary address. Only when a destination is allowed
//     by its IP does the proxy dial that IP.
//   - No dial reaches loopback, link-local, the sandbox pool or an address
//     of the host, whatever a name resolves to.
//   - Secret values are read at request time from the daemon's store and
//     exist only in the daemon's memory and the upstream TLS connection.
//     They are never sent in cleartext (plain HTTP requests are not
//     injected) and never logged.
//   - A sandbox's Policy is replaced whole (atomic pointer); a PATCH applies
//     to the next request or connection.
package proxy

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/connlimit"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/network"
)

// SecretSource resolves workspace secrets by name (internal/secrets.Vault).
type SecretSource interface {
	Secret(ctx context.Context, workspaceID, name string) ([]byte, error)
	// MayUse returns nil if p may reference secret name in a proxy rule
	// (a rule can send the value to a host of its author's choosing, so
	// this is the right to read it), else an error wrapping
	// errdefs.ErrForbidden.
	MayUse(ctx context.Context, p auth.Principal, name string) error
}

// Config configures a Service. Fields left zero get defaults.
type Config struct {
	// Network programs the per-sandbox redirect and packet policy.
	Network *network.Manager
	// CADir holds the CA (<data-dir>/ca).
	CADir string
	// Listen is the proxy's address (default "0.0.0.0:0": an ephemeral
	// port; only redirected sandbox flows are admitted to it).
	Listen string
	// ExtraRootsPEM are trusted for upstream TLS besides the system roots
	// (daemon flag --egress-ca-file).
	ExtraRootsPEM []byte
	// Resolve overrides DNS for names (daemon flag --egress-resolve).
	Resolve map[string]netip.Addr
	// Secrets resolves workspace_secret header values.
	Secrets SecretSource
	// DNSListen is the resolver's address, UDP and TCP (default
	// "0.0.0.0:0": a free port; sandboxes reach it only through the
	// redirect of their port 53, and it refuses any source that is not an
	// attached sandbox).
	DNSListen string
	// Upstreams are the resolvers (host:port) the daemon's resolver
	// forwards allowed queries to: the host's.
	Upstreams []string
	// MaxConnsPerSandbox caps the connections one sandbox holds open
	// through the proxy (each spliced one costs the daemon two file
	// descriptors); more are reset. Default 512.
	MaxConnsPerSandbox int
	// Forbidden are never dialled (the sandbox pool, typically), in
	// addition to loopback, link-local and the host's own addresses.
	Forbidden []netip.Prefix
	// Identity signs callback requests (nil: callbacks fail).
	Identity *jwtkeys.Signer
	// STSEndpoint overrides where role_arn rules assume their roles.
	STSEndpoint string
	Logger      *slog.Logger
	// Meter counts decisions and relayed bytes for metrics
	// (internal/telemetry); nil counts nothing.
	Meter Meter
	// Recorder receives every request, connection and DNS query for the
	// sandbox's audit record (internal/record); nil records nothing.
	Recorder Recorder
}

// Meter is what the proxy reports to metrics.
type Meter interface {
	// Egress counts one decision of Event kind (http, https, tls, dns).
	Egress(kind string, allowed bool)
	// EgressBytes counts bytes relayed up (from the sandbox) and down.
	EgressBytes(up, down int64)
	// Request starts the span of one HTTP request of sandbox id to host
	// (continuing a trace its headers carry); end gets its status.
	Request(ctx context.Context, h http.Header, id, method, host string) (_ context.Context, end func(status int))
}

// nopMeter is the Meter of a Config without one.
type nopMeter struct{}

func (nopMeter) Egress(string, bool)      {}
func (nopMeter) EgressBytes(int64, int64) {}
func (nopMeter) Request(ctx context.Context, _ http.Header, _, _, _ string) (context.Context, func(int)) {
	return ctx, func(int) {}
}

// Service is the running proxy. Safe for concurrent use.
type Service struct {
	cfg   Config
	ca    *CA
	roots *x509.CertPool
	log   *slog.Logger
	ln    net.Listener
	port  uint16
	srv   *http.Server
	conns *chanListener // connections handed to srv (plain HTTP, intercepted TLS)
	dns   *resolver
	// down is why the proxy stopped serving (its listener or resolver
	// ended), nil while it serves; Probe reports it.
	down atomic.Pointer[string]

	mu   sync.RWMutex
	byIP map[netip.Addr]*sandbox
	byID map[string]*sandbox

	local localAddrs

	// Minted credentials (keys name the sandbox): STS sessions, GCP
	// access tokens and callback answers.
	roles           expiring[aws.Credentials]
	gcpTokens       expiring[string]
	callbackAnswers expiring[http.Header]
}

// sandbox is one attached sandbox's proxy state.
type sandbox struct {
	id, workspace string
	netID         string // the network endpoint's id (for packet counters)
	ip            netip.Addr
	policy        atomic.Pointer[Policy]
	transport     *http.Transport
	log           eventLog
	dns           eventLog      // name lookups through the daemon's resolver
	dnsSlots      chan struct{} // bounds its forwarded queries in flight
	// filtered records that packet rules were installed for this sandbox
	// (by this process), so an open, unproxied policy — the common case —
	// costs no nftables transaction at boot, and replacing a restrictive
	// policy with an open one still clears its rules. Guarded by Service.mu.
	filtered bool
}

// New loads (or creates) the CA and starts listening. Call Close to stop.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Network == nil || cfg.CADir == "" {
		return nil, fmt.Errorf("proxy: network and CA dir are required: %w", errdefs.ErrInvalid)
	}
	if cfg.Listen == "" {
		cfg.Listen = "0.0.0.0:0"
	}
	if cfg.DNSListen == "" {
		cfg.DNSListen = "0.0.0.0:0"
	}
	if cfg.Meter == nil {
		cfg.Meter = nopMeter{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ca, err := LoadOrCreateCA(cfg.CADir)
	if err != nil {
		return nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if len(cfg.ExtraRootsPEM) > 0 && !roots.AppendCertsFromPEM(cfg.ExtraRootsPEM) {
		return nil, fmt.Errorf("proxy: extra roots hold no PEM certificate: %w", errdefs.ErrInvalid)
	}
	if cfg.MaxConnsPerSandbox == 0 {
		cfg.MaxConnsPerSandbox = 512
	}
	raw, err := net.Listen("tcp4", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("proxy: listen on %s: %w", cfg.Listen, err)
	}
	// Sources are sandbox addresses (anti-spoofing holds them to their
	// veth), so the per-client cap is a per-sandbox cap.
	ln := connlimit.Listen(raw, cfg.MaxConnsPerSandbox, func(c *net.TCPConn) { reset(c) })
	s := &Service{
		cfg: cfg, ca: ca, roots: roots, log: cfg.Logger, ln: ln,
		port:  uint16(ln.Addr().(*net.TCPAddr).Port),
		conns: newChanListener(ln.Addr()),
		byIP:  map[netip.Addr]*sandbox{},
		byID:  map[string]*sandbox{},
	}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ConnContext:       connContext,
		ErrorLog:          slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	if s.dns, err = s.startDNS(cfg.DNSListen); err != nil {
		ln.Close()
		return nil, err
	}
	if err := cfg.Network.RedirectAll(s.port, s.dns.port); err != nil {
		ln.Close()
		s.dns.close()
		return nil, err
	}
	go func() {
		if err := s.srv.Serve(s.conns); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.stopped("HTTP server: " + err.Error())
		}
	}()
	go s.acceptLoop()
	s.log.Info("egress proxy listening", "addr", ln.Addr().String(), "dns_port", s.dns.port, "dns_upstreams", cfg.Upstreams)
	return s, nil
}

// Port is the proxy's TCP port on every host-side veth address.
func (s *Service) Port() uint16 { return s.port }

// stopped records the first reason the proxy stopped serving.
func (s *Service) stopped(why string) { s.down.CompareAndSwap(nil, &why) }

// Probe is the proxy's health probe: nil while its listener and resolver
// serve.
func (s *Service) Probe(context.Context) error {
	if why := s.down.Load(); why != nil {
		return fmt.Errorf("egress proxy stopped: %s", *why)
	}
	return nil
}

// CA returns the install's CA.
func (s *Service) CA() *CA { return s.ca }

// Close stops accepting and closes idle upstream connections. Spliced
// connections end when their peers close.
func (s *Service) Close() error {
	err := s.ln.Close()
	_ = s.srv.Close()
	s.dns.close()
	s.mu.Lock()
	for _, sb := range s.byID {
		sb.transport.CloseIdleConnections()
	}
	s.mu.Unlock()
	return err
}

// Validate parses a proxy_config without applying it and checks that p
// may use every workspace secret its rules reference.
func (s *Service) Validate(ctx context.Context, p auth.Principal, cfg []byte) error {
	pol, err := Parse(cfg)
	if err != nil {
		return err
	}
	for _, name := range pol.SecretNames() {
		if s.cfg.Secrets == nil {
			return errdefs.Field("proxy_config.rules", "workspace secrets are not configured on this server")
		}
		if err := s.cfg.Secrets.MayUse(ctx, p, name); err != nil {
			return fmt.Errorf("proxy_config.rules: %w", err)
		}
	}
	return nil
}

// Attach enforces cfg (raw proxy_config; nil means none) for the sandbox id
// of workspace at ep: it replaces the proxy's policy for the sandbox and its
// packet-level rules. Idempotent; used at boot and on PATCH.
func (s *Service) Attach(ctx context.Context, id, workspace string, ep *network.Endpoint, cfg []byte) error {
	pol, err := Parse(cfg)
	if err != nil {
		return err
	}
	s.mu.Lock()
	sb := s.byID[id]
	if sb == nil {
		sb = &sandbox{id: id, workspace: workspace, ip: ep.SandboxIP, dnsSlots: make(chan struct{}, dnsInflight),
			log: eventLog{meter: s.cfg.Meter}, dns: eventLog{meter: s.cfg.Meter}}
		sb.transport = s.newTransport(sb)
		s.byID[id] = sb
	}
	if sb.ip != ep.SandboxIP {
		delete(s.byIP, sb.ip)
		sb.ip = ep.SandboxIP
	}
	s.byIP[ep.SandboxIP] = sb
	sb.netID = ep.ID
	sb.policy.Store(pol)
	s.mu.Unlock()

	np := network.EgressPolicy{Mode: network.EgressOpen}
	switch pol.Mode {
	case ModeAllow:
		np.Mode = network.EgressAllow
	case ModeDeny:
		np.Mode = network.EgressDeny
	}
	for _, n := range pol.Nets() {
		if n.Addr().Is4() {
			np.Nets = append(np.Nets, n)
		}
	}
	if pol.Proxied() {
		np.ProxyPort, np.DNSPort = s.port, s.dns.port
	}
	// Without a policy the sandbox's web and DNS still come to the proxy
	// and resolver (RedirectAll, at New), as a pass-through: only an
	// enforced policy needs rules of its own.
	open := np.Mode == network.EgressOpen && np.ProxyPort == 0
	s.mu.Lock()
	skip := open && !sb.filtered
	s.mu.Unlock()
	if skip {
		return nil
	}
	if err := s.cfg.Network.SetEgress(ep.ID, np); err != nil {
		return fmt.Errorf("proxy: attach %s: %w", id, err)
	}
	s.mu.Lock()
	sb.filtered = !open
	s.mu.Unlock()
	s.log.DebugContext(ctx, "egress policy applied", "sandbox", id, "mode", pol.Mode.String(), "nets", len(np.Nets), "rules", len(pol.Rules), "proxied", pol.Proxied())
	return nil
}

// Detach forgets sandbox id (its packet rules go with its network
// endpoint). Idempotent.
func (s *Service) Detach(ctx context.Context, id string) error {
	s.mu.Lock()
	sb := s.byID[id]
	if sb != nil {
		delete(s.byID, id)
		if s.byIP[sb.ip] == sb {
			delete(s.byIP, sb.ip)
		}
	}
	s.mu.Unlock()
	if sb != nil {
		sb.transport.CloseIdleConnections()
	}
	return nil
}

// Log returns sandbox id's egress report (empty for a sandbox that is not
// running): the proxy's counters and events plus the packet filter's
// rejected-packet count.
func (s *Service) Log(id string) Report {
	s.mu.RLock()
	sb := s.byID[id]
	s.mu.RUnlock()
	if sb == nil {
		return Report{Mode: ModeOpen.String(), Events: []Event{}, DNS: DNSLog{Queries: []Event{}}}
	}
	r := sb.log.report()
	r.Mode = sb.policy.Load().Mode.String()
	d := sb.dns.report()
	r.DNS = DNSLog{Allowed: d.Allowed, Denied: d.Denied, Queries: d.Events}
	if n, err := s.cfg.Network.EgressRejected(sb.netID); err == nil {
		r.RawIPRejected = n
	}
	return r
}

func (s *Service) bySource(a netip.Addr) *sandbox {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.byIP[a.Unmap()]
}

// acceptLoop hands each redirected connection to its own goroutine.
func (s *Service) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				s.stopped("listener closed")
				s.conns.Close()
				return
			}
			s.log.Warn("egress proxy accept", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go s.handle(c.(tcpConn))
	}
}

// tcpConn is an accepted connection: a *net.TCPConn or the
// connlimit.Conn wrapping one.
type tcpConn interface {
	net.Conn
	syscall.Conn
	SetLinger(sec int) error
	CloseWrite() error
}

// handle classifies one connection: TLS (first byte 0x16) or plain HTTP.
func (s *Service) handle(c tcpConn) {
	peer := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	sb := s.bySource(peer)
	od, err := network.OriginalDst(c)
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if sb == nil || err != nil || od.Addr().Unmap() == local.Addr().Unmap() && od.Port() == local.Port() {
		// Not a redirected flow of an attached sandbox.
		reset(c)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReaderSize(c, 4096)
	first, err := br.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	bc := &bufConn{Conn: c, r: br}
	if first[0] == 0x16 {
		s.handleTLS(sb, bc, od)
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	s.conns.push(&meteredConn{Conn: bc, meta: &connMeta{sb: sb, od: od}})
}

// reset closes c with a TCP RST, so the client fails at once.
func reset(c tcpConn) {
	_ = c.SetLinger(0)
	_ = c.Close()
}

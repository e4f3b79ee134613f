// Package gateway exposes HTTP services that run inside sandboxes, and
// serves nothing else: it authorizes a request by a signed, short-lived
// token (or a login that turns into one), resolves the sandbox, wakes it if
// it is stopped, and reverse-proxies to SandboxIP:port from the host, where
// the network policy lets the daemon open connections into a sandbox.
//
// Two URL forms reach the same service:
//
//	host form  <scheme>://<name>--<port>.<service-domain>/<path>   (only with a service domain)
//	path form  <public-url>/s/<sandbox-id-or-name>/<port>/<path>
//
// Security model:
//   - A service token names one workspace, sandbox id and port, and expires.
//     A token is valid only on a URL naming that sandbox and port.
//   - Credentials (the token header, the token cookie, X-Api-Key) are
//     removed before a request is forwarded, so the service never sees them.
//   - Tokens are HMAC-signed by a per-install key (Signer); nothing about a
//     grant is stored except login-mode grants (in memory).
//
// The gateway writes no HTTP error bodies of its own: failures are typed
// errors (internal/errdefs) handed to Config.WriteError, which internal/api
// supplies.
package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Sandboxes is what the gateway needs from the sandbox manager.
type Sandboxes interface {
	// Resolve returns sandbox ref (id, or name within workspaceID) of
	// workspaceID without waking it.
	Resolve(ctx context.Context, workspaceID, ref string) (*store.Sandbox, error)
	// Address returns running sandbox id's IP, booting it if stopped, and a
	// channel closed when that instance goes.
	Address(ctx context.Context, id string) (netip.Addr, <-chan struct{}, error)
	// Acquire marks a request on sandbox id as open (activity, for the idle
	// TTL) until release is called.
	Acquire(id string) (release func())
	// SandboxAccess is sb as the policy sees it for p, with the access
	// p's shares grant.
	SandboxAccess(ctx context.Context, p auth.Principal, sb *store.Sandbox) (authz.Owned, error)
}

// Authenticator turns an API key into a principal (login mode).
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (auth.Principal, error)
}

// Users is what the gateway needs from the identity store.
type Users interface {
	GetUser(ctx context.Context, workspaceID, id string) (*store.User, error)
}

// ErrorWriter writes err as an HTTP error response.
type ErrorWriter func(ctx context.Context, w http.ResponseWriter, err error)

// Config configures a Gateway.
type Config struct {
	// PublicURL is the daemon's externally reachable base URL; path-form
	// service URLs, login URLs and download links hang off it.
	PublicURL string
	// ServiceDomain, when set, enables host-form URLs
	// <name>--<port>.<ServiceDomain> (wildcard DNS must point at the daemon).
	ServiceDomain string
	Signer        *Signer
	Sandboxes     Sandboxes
	Auth          Authenticator
	WriteError    ErrorWriter
	Logger        *slog.Logger
	// Identity signs the X-Langsmith-User-Token of login-mode requests
	// (nil: no token is set, the id and email headers still are).
	Identity *jwtkeys.Signer
	// Users looks up a logged-in user's name and email (nil: id only).
	Users Users
	// LoginTTL is how long a browser login to a login-mode service lasts
	// (default DefaultLoginTTL).
	LoginTTL time.Duration
}

// DefaultLoginTTL is the default lifetime of a login-mode session.
const DefaultLoginTTL = 12 * time.Hour

// cookieName holds a service token in browsers. Cookies are scoped to one
// sandbox and port: by host in the host form, by path in the path form.
const cookieName = "cubicle_service_token"

// Gateway serves sandbox services and mints their URLs.
//
// Invariants: grants holds the login-mode access of each (sandbox, port)
// that has one; a port with a grant refuses new token-mode URLs
// (errdefs.ErrConflict). targets caches resolved addresses; an entry is used
// only while its gone channel is open.
type Gateway struct {
	cfg    Config
	public *url.URL
	domain string
	proxy  *httputil.ReverseProxy

	mu      sync.Mutex
	grants  map[grantKey]string   // → protocol.Access*
	embeds  map[grantKey][]string // a login grant's embed origins
	targets map[string]*target    // by sandbox id
	// sessions are the open requests (WebSockets included) of login
	// sessions, each with the cancel that ends it; Reauthorize re-admits
	// them.
	sessions map[*Claims]context.CancelFunc
}

type grantKey struct {
	sandbox string
	port    int
}

// target is a resolved, running sandbox.
type target struct {
	id, name, workspace string
	ip                  netip.Addr
	gone                <-chan struct{}
}

// New returns a Gateway. PublicURL must be an absolute URL.
func New(cfg Config) (*Gateway, error) {
	pub, err := url.Parse(strings.TrimRight(cfg.PublicURL, "/"))
	if err != nil || pub.Scheme == "" || pub.Host == "" {
		return nil, fmt.Errorf("gateway: public URL %q is not absolute: %w", cfg.PublicURL, errdefs.ErrInvalid)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LoginTTL <= 0 {
		cfg.LoginTTL = DefaultLoginTTL
	}
	domain := strings.Trim(strings.ToLower(cfg.ServiceDomain), ".")
	if domain != "" && !hostnameRE.MatchString(domain) {
		return nil, fmt.Errorf("gateway: service domain %q is not a hostname: %w", cfg.ServiceDomain, errdefs.ErrInvalid)
	}
	g := &Gateway{cfg: cfg, public: pub, domain: domain, grants: map[grantKey]string{}, embeds: map[grantKey][]string{}, targets: map[string]*target{},
		sessions: map[*Claims]context.CancelFunc{}}
	g.proxy = g.newProxy()
	return g, nil
}

var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$`)

// newProxy returns the reverse proxy. FlushInterval -1 flushes after every
// write, so server-sent events and other streams are not held back; the
// proxy passes Upgrade (WebSocket) requests through on its own.
func (g *Gateway) newProxy() *httputil.ReverseProxy {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil, // sandbox traffic never goes through a host proxy
		DialContext:           d.DialContext,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // relay bytes as the service sent them
	}
	return &httputil.ReverseProxy{
		Rewrite:        rewrite,
		ModifyResponse: modifyResponse,
		Transport:      tr,
		FlushInterval:  -1,
		ErrorLog:       slog.NewLogLogger(g.cfg.Logger.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			g.cfg.WriteError(r.Context(), w, fmt.Errorf("reach sandbox service: %v: %w", err, errdefs.ErrUnavailable))
		},
	}
}

// ServiceLink is a minted token-mode service URL.
type ServiceLink struct {
	ServiceURL string
	BrowserURL string
	Token      string
	ExpiresAt  time.Time
	// EmbedURL is set when embed origins were given: the page to load in
	// an iframe (the token rides its fragment).
	EmbedURL string
}

// IssueService mints a token for port of sb valid for ttl; the origins in
// embed (normalized origins) may frame it. It
// fails with errdefs.ErrConflict while a login grant is active on that port.
func (g *Gateway) IssueService(ctx context.Context, sb *store.Sandbox, port int, ttl time.Duration, embed []string) (ServiceLink, error) {
	g.mu.Lock()
	access, granted := g.grants[grantKey{sb.ID, port}]
	g.mu.Unlock()
	if granted {
		return ServiceLink{}, fmt.Errorf("port %d of sandbox %s has %s login access; token URLs are not issued for it: %w", port, sb.Name, access, errdefs.ErrConflict)
	}
	exp := time.Now().Add(ttl).Truncate(time.Second)
	tok, err := g.cfg.Signer.Sign(Claims{Audience: AudienceService, Workspace: sb.WorkspaceID, Sandbox: sb.ID, Port: port, Expires: exp.Unix(), Embed: embed})
	if err != nil {
		return ServiceLink{}, err
	}
	base := g.serviceBase(sb, port)
	l := ServiceLink{ServiceURL: base, BrowserURL: base + "/?token=" + url.QueryEscape(tok), Token: tok, ExpiresAt: exp.UTC()}
	if len(embed) > 0 {
		l.EmbedURL = g.public.String() + embedPath + "#token=" + url.QueryEscape(tok)
	}
	return l, nil
}

// LoginLink is a login-mode service URL.
type LoginLink struct {
	ServiceURL string
	BrowserURL string
	Access     string
}

// GrantLogin gives port of sb login-mode access (protocol.AccessRestricted
// or AccessWorkspace) and the origins that may frame it, replacing any
// earlier grant. Grants live in memory: they end when the daemon restarts.
func (g *Gateway) GrantLogin(ctx context.Context, sb *store.Sandbox, port int, access string, embed []string) LoginLink {
	g.mu.Lock()
	g.grants[grantKey{sb.ID, port}] = access
	g.embeds[grantKey{sb.ID, port}] = embed
	g.mu.Unlock()
	q := url.Values{"sandbox": {sb.ID}, "port": {strconv.Itoa(port)}}
	return LoginLink{ServiceURL: g.serviceBase(sb, port), BrowserURL: g.public.String() + "/s/login?" + q.Encode(), Access: access}
}

// grant returns the login-mode access of (id, port), if any.
func (g *Gateway) grant(id string, port int) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a, ok := g.grants[grantKey{id, port}]
	return a, ok
}

// grantEmbed returns the embed origins of (id, port)'s login grant.
func (g *Gateway) grantEmbed(id string, port int) []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.embeds[grantKey{id, port}]
}

// DownloadLink is a minted download link.
type DownloadLink struct {
	URL   string
	Token string
	// ExpiresAt is zero for a link that never expires.
	ExpiresAt time.Time
}

// IssueDownload mints a link to path in sb, pinned to the content type and
// disposition given (either may be empty). ttl 0 means it never expires.
func (g *Gateway) IssueDownload(ctx context.Context, sb *store.Sandbox, path, contentType, disposition string, ttl time.Duration) (DownloadLink, error) {
	c := Claims{Audience: AudienceDownload, Workspace: sb.WorkspaceID, Sandbox: sb.ID, Path: path, ContentType: contentType, Disposition: disposition}
	if ttl > 0 {
		c.Expires = time.Now().Add(ttl).Truncate(time.Second).Unix()
	}
	tok, err := g.cfg.Signer.Sign(c)
	if err != nil {
		return DownloadLink{}, err
	}
	return DownloadLink{URL: g.public.String() + "/d/" + tok, Token: tok, ExpiresAt: c.ExpiresAt()}, nil
}

// VerifyDownload checks a download link's token and returns what it pins.
func (g *Gateway) VerifyDownload(token string) (Claims, error) {
	return g.cfg.Signer.Verify(token, AudienceDownload)
}

// serviceBase is the URL of port of sb, without a trailing slash: the host
// form when a service domain is set, else the path form. Both name the
// sandbox in a way that survives a rename where they can (the id in the
// path form; the name in the host form, as the protocol has it, falling back
// to the id when the name is not a lower-case DNS label).
func (g *Gateway) serviceBase(sb *store.Sandbox, port int) string {
	if g.domain == "" {
		return fmt.Sprintf("%s/s/%s/%d", g.public.String(), url.PathEscape(sb.ID), port)
	}
	label := sb.Name
	if !dnsLabelRE.MatchString(label) || len(label)+len("--65535") > 63 {
		label = sb.ID
	}
	host := fmt.Sprintf("%s--%d.%s", label, port, g.domain)
	if p := g.public.Port(); p != "" {
		host = net.JoinHostPort(host, p)
	}
	return g.public.Scheme + "://" + host
}

var dnsLabelRE = regexp.MustCompile(`^[a-z0-9-]+$`)

// OwnsHost reports whether host (a request's Host) is a host-form service
// address, which the gateway serves whatever the path.
func (g *Gateway) OwnsHost(host string) bool {
	_, _, ok := g.matchHost(host)
	return ok
}

// matchHost parses <ref>--<port>.<domain>[:port].
func (g *Gateway) matchHost(host string) (ref string, port int, ok bool) {
	if g.domain == "" {
		return "", 0, false
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	label, found := strings.CutSuffix(host, "."+g.domain)
	if !found || strings.Contains(label, ".") {
		return "", 0, false
	}
	i := strings.LastIndex(label, "--")
	if i <= 0 {
		return "", 0, false
	}
	port, ok = parsePort(label[i+2:])
	return label[:i], port, ok
}

func parsePort(s string) (int, bool) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != s {
		return 0, false
	}
	return p, true
}

// resolve returns the running target for sandbox id of workspace, from the
// cache while its instance lives, else through the manager (waking it).
func (g *Gateway) resolve(ctx context.Context, workspace, id string) (*target, error) {
	g.mu.Lock()
	t := g.targets[id]
	g.mu.Unlock()
	if t != nil && t.workspace == workspace && !closed(t.gone) {
		return t, nil
	}
	sb, err := g.cfg.Sandboxes.Resolve(ctx, workspace, id)
	if errdefs.IsNotFound(err) {
		g.forget(id)
	}
	if err != nil {
		return nil, err
	}
	ip, gone, err := g.cfg.Sandboxes.Address(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	t = &target{id: sb.ID, name: sb.Name, workspace: sb.WorkspaceID, ip: ip, gone: gone}
	g.mu.Lock()
	g.targets[sb.ID] = t
	g.mu.Unlock()
	return t, nil
}

// forget drops what the gateway holds about a deleted sandbox.
func (g *Gateway) forget(id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.targets, id)
	for k := range g.grants {
		if k.sandbox == id {
			delete(g.grants, k)
			delete(g.embeds, k)
		}
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

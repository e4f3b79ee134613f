package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// errNoCredential is a request to a service that carries no token at all;
// browsers asking for HTML are sent to the login page instead.
var errNoCredential = fmt.Errorf("no service token: send the %s header or open the browser_url: %w", protocol.ServiceTokenHeader, errdefs.ErrUnauthorized)

// route is the service a request's URL names.
type route struct {
	ref  string // sandbox id or name, unescaped
	port int
	// prefix is "/s/<ref>/<port>" in the path form and "" in the host form.
	prefix string
	// rest is the escaped path to forward ("" only for a bare path-form
	// prefix, which is redirected to prefix + "/").
	rest string
}

// cookiePrefix is the path the token cookie for claims c is scoped to on
// rt, without the trailing slash: in the path form, whose origin every
// sandbox shares, /s/<sandbox id>/<port> (by id, so a cookie set through a
// name does not follow the name to another sandbox); "" in the host form,
// where the cookie is host-only and the host names sandbox and port.
func (rt route) cookiePrefix(c Claims) string {
	if rt.prefix == "" {
		return ""
	}
	return "/s/" + url.PathEscape(c.Sandbox) + "/" + strconv.Itoa(rt.port)
}

// ServeHTTP serves host-form requests (any path) and the /s/ tree:
// /s/login and /s/<sandbox>/<port>/... .
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ref, port, ok := g.matchHost(r.Host); ok {
		g.serve(w, r, route{ref: ref, port: port, rest: r.URL.EscapedPath()})
		return
	}
	p := r.URL.EscapedPath()
	switch p {
	case "/s/login":
		g.login(w, r)
		return
	case embedPath:
		g.embed(w, r)
		return
	}
	rt, ok := parsePath(p)
	if !ok {
		g.cfg.WriteError(r.Context(), w, fmt.Errorf("no service at %s (want /s/<sandbox>/<port>/...): %w", r.URL.Path, errdefs.ErrNotFound))
		return
	}
	if rt.rest == "" {
		u := rt.prefix + "/"
		if r.URL.RawQuery != "" {
			u += "?" + r.URL.RawQuery
		}
		http.Redirect(w, r, u, http.StatusTemporaryRedirect)
		return
	}
	g.serve(w, r, rt)
}

// parsePath parses an escaped /s/<ref>/<port>[/rest] path.
func parsePath(p string) (route, bool) {
	tail, ok := strings.CutPrefix(p, "/s/")
	if !ok {
		return route{}, false
	}
	rawRef, tail, ok := strings.Cut(tail, "/")
	if !ok {
		return route{}, false
	}
	rawPort, rest, slash := strings.Cut(tail, "/")
	ref, err := url.PathUnescape(rawRef)
	if err != nil || ref == "" {
		return route{}, false
	}
	port, ok := parsePort(rawPort)
	if !ok {
		return route{}, false
	}
	rt := route{ref: ref, port: port, prefix: "/s/" + rawRef + "/" + rawPort}
	if slash {
		rt.rest = "/" + rest
	}
	return rt, true
}

// serve authorizes a request for rt and proxies it to the sandbox.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, rt route) {
	ctx := r.Context()
	// browser_url: trade ?token= for a cookie. Only a token of ours counts:
	// services such as Jupyter have a ?token= of their own.
	if tok := r.URL.Query().Get("token"); strings.HasPrefix(tok, jwtHeader+".") {
		g.setCookie(w, r, rt, tok)
		return
	}
	c, err := g.authorize(ctx, r, rt)
	if errors.Is(err, errNoCredential) && r.Method == http.MethodGet && strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, g.loginURL(rt), http.StatusSeeOther)
		return
	}
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	if c.User != "" {
		if err := g.recheck(ctx, c); err != nil {
			g.cfg.WriteError(ctx, w, err)
			return
		}
		var end func()
		ctx, end = g.openSession(ctx, &c)
		defer end()
	}
	release := g.cfg.Sandboxes.Acquire(c.Sandbox)
	defer release()
	t, err := g.resolve(ctx, c.Workspace, c.Sandbox)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	fw := &forward{addr: netip.AddrPortFrom(t.ip, uint16(rt.port)).String(), rest: rt.rest, prefix: rt.prefix, embed: c.Embed}
	if fw.user, err = g.userHeaders(c, r.Host); err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, forwardKey{}, fw)))
}

// recheck re-admits the user of a login session's token c, so that a
// share revoked (or a grant changed) ends the session at its next request.
func (g *Gateway) recheck(ctx context.Context, c Claims) error {
	sb, err := g.cfg.Sandboxes.Resolve(ctx, c.Workspace, c.Sandbox)
	if err != nil {
		return err
	}
	p := auth.Principal{WorkspaceID: c.Workspace, User: c.User, Role: c.Role}
	if _, err := g.admit(ctx, p, sb, c.Port, c.Sandbox); err != nil {
		return fmt.Errorf("login session ended: %w", err)
	}
	return nil
}

// openSession registers a login session's request until end is called;
// Reauthorize cancels ctx (which ends a proxied WebSocket too) when its
// user loses access.
func (g *Gateway) openSession(ctx context.Context, c *Claims) (_ context.Context, end func()) {
	ctx, cancel := context.WithCancel(ctx)
	g.mu.Lock()
	g.sessions[c] = cancel
	g.mu.Unlock()
	return ctx, func() {
		g.mu.Lock()
		delete(g.sessions, c)
		g.mu.Unlock()
		cancel()
	}
}

// Reauthorize re-admits every open login-session request and ends those
// whose user lost access (a share revoked). The sandbox manager calls it
// after any change that can take access away.
func (g *Gateway) Reauthorize(ctx context.Context) {
	g.mu.Lock()
	open := make(map[*Claims]context.CancelFunc, len(g.sessions))
	for c, cancel := range g.sessions {
		open[c] = cancel
	}
	g.mu.Unlock()
	for c, cancel := range open {
		if err := g.recheck(ctx, *c); err != nil {
			g.cfg.Logger.InfoContext(ctx, "login session cut", "sandbox", c.Sandbox, "user", c.User, "err", err)
			cancel()
		}
	}
}

// authorize finds a token for rt among the request's credentials (the
// header first, then cookies) and returns its claims. It fails with the
// first token's error, or errNoCredential when there is none.
func (g *Gateway) authorize(ctx context.Context, r *http.Request, rt route) (Claims, error) {
	toks := r.Header.Values(protocol.ServiceTokenHeader)
	for _, c := range r.Cookies() {
		if c.Name == cookieName {
			toks = append(toks, c.Value)
		}
	}
	if len(toks) == 0 {
		return Claims{}, errNoCredential
	}
	var first error
	for _, tok := range toks {
		c, err := g.claimsFor(ctx, tok, rt)
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
	}
	return Claims{}, first
}

// claimsFor verifies tok and checks that it is for the sandbox and port rt
// names. It does not wake the sandbox, so a foreign token costs nothing.
func (g *Gateway) claimsFor(ctx context.Context, tok string, rt route) (Claims, error) {
	c, err := g.cfg.Signer.Verify(tok, AudienceService)
	if err != nil {
		return Claims{}, err
	}
	if c.Port != rt.port {
		return Claims{}, fmt.Errorf("token is for port %d, not %d: %w", c.Port, rt.port, errdefs.ErrUnauthorized)
	}
	if rt.ref == c.Sandbox {
		return c, nil
	}
	g.mu.Lock()
	t := g.targets[c.Sandbox]
	g.mu.Unlock()
	if t != nil && strings.EqualFold(rt.ref, t.name) {
		return c, nil
	}
	// Unknown or renamed since cached: ask the store (without waking).
	sb, err := g.cfg.Sandboxes.Resolve(ctx, c.Workspace, c.Sandbox)
	if err != nil && !errdefs.IsNotFound(err) {
		return Claims{}, err
	}
	if err != nil || !strings.EqualFold(rt.ref, sb.Name) {
		return Claims{}, fmt.Errorf("token is for another sandbox: %w", errdefs.ErrUnauthorized)
	}
	if t != nil {
		g.mu.Lock()
		t.name = sb.Name
		g.mu.Unlock()
	}
	return c, nil
}

// setCookie checks a browser_url token, stores it in an HttpOnly cookie
// scoped to this sandbox and port (see cookiePrefix), and redirects to the
// same URL — in the path form, by the sandbox's id — without the token, so
// it leaves the address bar and never reaches the service.
func (g *Gateway) setCookie(w http.ResponseWriter, r *http.Request, rt route, tok string) {
	c, err := g.claimsFor(r.Context(), tok, rt)
	if err != nil {
		g.cfg.WriteError(r.Context(), w, err)
		return
	}
	prefix := rt.cookiePrefix(c)
	secure := r.TLS != nil || g.public.Scheme == "https"
	same := http.SameSiteLaxMode
	if len(c.Embed) > 0 && secure {
		// Sent inside a cross-site iframe only when SameSite=None.
		same = http.SameSiteNoneMode
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: tok, Path: prefix + "/", Expires: c.ExpiresAt(),
		HttpOnly: true, Secure: secure, SameSite: same,
	})
	q := r.URL.Query()
	q.Del("token")
	// One leading slash: "//host/..." would redirect off the gateway.
	target := prefix + "/" + strings.TrimLeft(rt.rest, "/")
	if len(q) > 0 {
		target += "?" + q.Encode()
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// loginURL is where a browser without a token is sent.
func (g *Gateway) loginURL(rt route) string {
	q := url.Values{"sandbox": {rt.ref}, "port": {strconv.Itoa(rt.port)}}
	return g.public.String() + "/s/login?" + q.Encode()
}

// forward is where one authorized request goes; serve passes it to rewrite
// through the request context.
type forward struct {
	addr   string // SandboxIP:port
	rest   string // escaped path
	prefix string // path-form prefix, for X-Forwarded-Prefix
	// user is the X-Langsmith-User-* headers asserted for a login-mode
	// session (nil otherwise); embed the origins that may frame responses.
	user  http.Header
	embed []string
}

type forwardKey struct{}

// rewrite points the outgoing request at the sandbox and strips every
// credential meant for Cubicle.
func rewrite(pr *httputil.ProxyRequest) {
	fw := pr.In.Context().Value(forwardKey{}).(*forward)
	out := pr.Out
	// The service sees the Host it was reached by (the audience of the
	// user token is that host), not its sandbox address.
	out.URL.Scheme, out.URL.Host, out.Host = "http", fw.addr, pr.In.Host
	out.URL.RawPath = fw.rest
	if p, err := url.PathUnescape(fw.rest); err == nil {
		out.URL.Path = p
	}
	pr.SetXForwarded()
	if fw.prefix != "" {
		out.Header.Set("X-Forwarded-Prefix", fw.prefix)
	}
	stripCredentials(out.Header)
	stripUserHeaders(out.Header)
	for k, vs := range fw.user {
		out.Header[k] = vs
	}
}

// modifyResponse removes the gateway's cookie from a service's response
// and says who may frame it: the token's embed origins, else nobody. The
// policy is added beside the service's own (a browser enforces each), so
// the service keeps its CSP and may only narrow the framing further.
func modifyResponse(resp *http.Response) error {
	fw, _ := resp.Request.Context().Value(forwardKey{}).(*forward)
	if fw != nil {
		resp.Header.Add("Content-Security-Policy", frameAncestors(fw.embed))
	}
	return stripGatewayCookies(resp)
}

// stripGatewayCookies drops the Set-Cookie headers of a service's
// response that would set the gateway's token cookie, whatever their
// Domain or Path: in the path form every sandbox shares the daemon's
// origin, so a hostile service could otherwise plant or replace the token
// cookie of other sandboxes and ports. The service's own cookies pass.
func stripGatewayCookies(resp *http.Response) error {
	lines := resp.Header.Values("Set-Cookie")
	kept := lines[:0:0]
	for _, line := range lines {
		pair, _, _ := strings.Cut(line, ";")
		name, _, _ := strings.Cut(pair, "=")
		if !strings.EqualFold(strings.TrimSpace(name), cookieName) {
			kept = append(kept, line)
		}
	}
	switch {
	case len(kept) == len(lines):
	case len(kept) == 0:
		resp.Header.Del("Set-Cookie")
	default:
		resp.Header["Set-Cookie"] = kept
	}
	return nil
}

// stripCredentials removes the service token header, API keys and the token
// cookie, keeping the service's own cookies.
func stripCredentials(h http.Header) {
	h.Del(protocol.ServiceTokenHeader)
	h.Del("X-Api-Key")
	lines := h.Values("Cookie")
	if len(lines) == 0 {
		return
	}
	var kept []string
	for _, line := range lines {
		for _, part := range strings.Split(line, ";") {
			part = strings.TrimSpace(part)
			name, _, _ := strings.Cut(part, "=")
			if part != "" && strings.TrimSpace(name) != cookieName {
				kept = append(kept, part)
			}
		}
	}
	h.Del("Cookie")
	if len(kept) > 0 {
		h.Set("Cookie", strings.Join(kept, "; "))
	}
}

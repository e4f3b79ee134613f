package gateway

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Headers the gateway asserts to a service about a login-mode session's
// user. X-Langsmith-User-Token is an EdDSA JWT (aud = the service host, sub
// = the user id) that the clients' SandboxTokenVerifier checks against the
// daemon's JWKS; the other two are informational.
const (
	UserIDHeader    = "X-Langsmith-User-Id"
	UserEmailHeader = "X-Langsmith-User-Email"
	UserTokenHeader = "X-Langsmith-User-Token"
	userHeaderPfx   = "X-Langsmith-User-"
)

// UserTokenTTL is the lifetime of a minted X-Langsmith-User-Token: one is
// minted per request, so it only has to outlive the request's handling.
const UserTokenTTL = 5 * time.Minute

// stripUserHeaders removes every X-Langsmith-User-* header a caller sent,
// whatever its case: only the gateway may assert who the user is.
func stripUserHeaders(h http.Header) {
	for k := range h {
		if len(k) >= len(userHeaderPfx) && strings.EqualFold(k[:len(userHeaderPfx)], userHeaderPfx) {
			delete(h, k)
		}
	}
}

// userHeaders returns the identity headers for a request with claims c to
// a service reached as host (the request's Host): none unless c is a
// login-mode session's.
func (g *Gateway) userHeaders(c Claims, host string) (http.Header, error) {
	if c.User == "" {
		return nil, nil
	}
	h := http.Header{UserIDHeader: {c.User}}
	if c.Email != "" {
		h.Set(UserEmailHeader, c.Email)
	}
	if g.cfg.Identity == nil {
		return h, nil
	}
	extra := map[string]any{}
	if c.Email != "" {
		extra["email"] = c.Email
	}
	if c.Name != "" {
		extra["name"] = c.Name
	}
	// The audience is the Host exactly as the service receives it, which
	// is what an app passes to its verifier.
	tok, err := g.cfg.Identity.Sign(host, c.User, UserTokenTTL, extra)
	if err != nil {
		return nil, err
	}
	h.Set(UserTokenHeader, tok)
	return h, nil
}

// frameAncestors is the Content-Security-Policy of a service response:
// framing by the given origins only, or by nobody.
func frameAncestors(origins []string) string {
	if len(origins) == 0 {
		return "frame-ancestors 'none'"
	}
	return "frame-ancestors " + strings.Join(origins, " ")
}

// embedPath serves embed_url: GET is a page (frameable by anyone; it
// holds nothing) whose script posts the token from its URL fragment back
// here; POST verifies the token and sends the frame to the service's
// browser_url flow, under the token's frame-ancestors. The fragment keeps
// the token out of the embedding page's logs and Referer.
const embedPath = "/s/embed"

func (g *Gateway) embed(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	switch r.Method {
	case http.MethodGet:
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'")
		_ = embedPage.Execute(w, nil)
		return
	case http.MethodPost:
	default:
		w.Header().Set("Allow", "GET, POST")
		g.cfg.WriteError(ctx, w, fmt.Errorf("embed takes GET or POST: %w", errdefs.ErrInvalid))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
	if err := r.ParseForm(); err != nil {
		g.cfg.WriteError(ctx, w, fmt.Errorf("embed form: %v: %w", err, errdefs.ErrInvalid))
		return
	}
	c, err := g.cfg.Signer.Verify(r.PostForm.Get("token"), AudienceService)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	if len(c.Embed) == 0 {
		g.cfg.WriteError(ctx, w, fmt.Errorf("this service URL was issued without embed_origins: %w", errdefs.ErrForbidden))
		return
	}
	path := r.PostForm.Get("redirect")
	if path == "" {
		path = "/"
	}
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") || strings.ContainsAny(path, "\\\r\n") {
		g.cfg.WriteError(ctx, w, errdefs.Field("redirect", "must be a path starting with a single /"))
		return
	}
	sb, err := g.cfg.Sandboxes.Resolve(ctx, c.Workspace, c.Sandbox)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	u, err := url.Parse(path)
	if err != nil {
		g.cfg.WriteError(ctx, w, errdefs.Field("redirect", "%v", err))
		return
	}
	q := u.Query()
	q.Set("token", r.PostForm.Get("token"))
	w.Header().Set("Content-Security-Policy", frameAncestors(c.Embed))
	http.Redirect(w, r, g.serviceBase(sb, c.Port)+u.EscapedPath()+"?"+q.Encode(), http.StatusSeeOther)
}

var embedPage = template.Must(template.New("embed").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Cubicle</title></head><body>
<form method="post" id="f"><input type="hidden" name="token"><input type="hidden" name="redirect"></form>
<script>
var p = new URLSearchParams(location.hash.slice(1)), f = document.getElementById("f");
f.token.value = p.get("token") || ""; f.redirect.value = p.get("redirect") || "/";
history.replaceState(null, "", location.pathname); f.submit();
</script></body></html>
`))

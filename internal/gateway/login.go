package gateway

import (
	"context"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// maxLoginForm bounds the login form body.
const maxLoginForm = 8 << 10

// login serves /s/login?sandbox=<id-or-name>&port=<port> for login-mode
// services (spec §9.2). The caller proves who they are with an API key —
// the X-Api-Key header, or the api_key field of the form this page shows —
// and, if the port's grant admits them, gets a service token for LoginTTL
// through the same cookie flow as a browser_url. Logging in is thus the only
// way into a login-mode port that has no token of its own.
func (g *Gateway) login(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	key := r.Header.Get("X-Api-Key")
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		r.Body = http.MaxBytesReader(w, r.Body, maxLoginForm)
		if err := r.ParseForm(); err != nil {
			g.cfg.WriteError(ctx, w, fmt.Errorf("login form: %v: %w", err, errdefs.ErrInvalid))
			return
		}
		if key == "" {
			key = r.PostForm.Get("api_key")
		}
	default:
		w.Header().Set("Allow", "GET, POST")
		g.cfg.WriteError(ctx, w, fmt.Errorf("login takes GET or POST: %w", errdefs.ErrInvalid))
		return
	}
	q := r.URL.Query()
	ref := q.Get("sandbox")
	port, ok := parsePort(q.Get("port"))
	if ref == "" || !ok {
		g.cfg.WriteError(ctx, w, errdefs.Field("port", "login needs ?sandbox=<id or name>&port=<1..65535>"))
		return
	}
	// Only the origins a grant names may frame its login (the login URL
	// names the sandbox by id); nobody else.
	framing := frameAncestors(g.grantEmbed(ref, port))
	w.Header().Set("Content-Security-Policy", framing)
	if key == "" && r.Method == http.MethodGet {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "+framing)
		_ = loginPage.Execute(w, map[string]any{"Sandbox": ref, "Port": port})
		return
	}
	p, err := g.cfg.Auth.Authenticate(ctx, key)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	sb, err := g.cfg.Sandboxes.Resolve(ctx, p.WorkspaceID, ref)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	access, err := g.admit(ctx, p, sb, port, ref)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	exp := time.Now().Add(g.cfg.LoginTTL).Truncate(time.Second)
	c := Claims{Audience: AudienceService, Workspace: sb.WorkspaceID, Sandbox: sb.ID, Port: port, Expires: exp.Unix(),
		Embed: g.grantEmbed(sb.ID, port), User: p.User, Role: p.Role}
	if g.cfg.Users != nil && p.User != "" {
		u, err := g.cfg.Users.GetUser(ctx, p.WorkspaceID, p.User)
		if err != nil && !errdefs.IsNotFound(err) {
			g.cfg.WriteError(ctx, w, err)
			return
		}
		if u != nil {
			c.Email, c.Name = u.Email, u.Name
		}
	}
	tok, err := g.cfg.Signer.Sign(c)
	if err != nil {
		g.cfg.WriteError(ctx, w, err)
		return
	}
	g.cfg.Logger.InfoContext(ctx, "service login", "sandbox", sb.ID, "port", port, "user", p.User, "access", access)
	http.Redirect(w, r, g.serviceBase(sb, port)+"/?token="+url.QueryEscape(tok), http.StatusSeeOther)
}

// admit returns the login access of port of sb if p may use it now (a
// login, and every request of the session it opens). A principal with no
// access to a restricted port's sandbox gets the not-found of a missing
// sandbox (ref as named); one that sees it but is not admitted, forbidden.
func (g *Gateway) admit(ctx context.Context, p auth.Principal, sb *store.Sandbox, port int, ref string) (string, error) {
	owned, err := g.cfg.Sandboxes.SandboxAccess(ctx, p, sb)
	if err != nil {
		return "", err
	}
	access, granted := g.grant(sb.ID, port)
	if granted && authz.AdmitsLogin(access, p, owned) {
		return access, nil
	}
	if authz.Level(p, owned) == authz.None && access != protocol.AccessWorkspace {
		return "", fmt.Errorf("sandbox %s: %w", ref, errdefs.ErrNotFound)
	}
	if !granted {
		return "", fmt.Errorf("port %d of sandbox %s has no login access; ask for a service URL with access set: %w", port, sb.Name, errdefs.ErrForbidden)
	}
	return "", fmt.Errorf("port %d of sandbox %s is restricted to those with access to the sandbox: %w", port, sb.Name, errdefs.ErrForbidden)
}

var loginPage = template.Must(template.New("login").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Cubicle sign-in</title>
<style>body{font-family:sans-serif;max-width:28em;margin:4em auto}input{width:100%;padding:.4em;margin:.4em 0}</style></head>
<body><h1>Sign in</h1>
<p>Sandbox <code>{{.Sandbox}}</code>, port {{.Port}}. Enter a Cubicle API key of its workspace.</p>
<form method="post"><input type="password" name="api_key" autocomplete="off" autofocus required>
<input type="submit" value="Sign in"></form></body></html>
`))

package gateway

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys/jwtkeystest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

type fakeUsers map[string]*store.User

func (f fakeUsers) GetUser(_ context.Context, ws, id string) (*store.User, error) {
	if u, ok := f[id]; ok && u.WorkspaceID == ws {
		return u, nil
	}
	return nil, fmt.Errorf("user %s: not found", id)
}

// TestUserIdentityHeaders: spoofed X-Langsmith-User-* headers never reach
// the service; a login-mode session's requests carry the logged-in user
// and a token signed for the service host that verifies against the JWKS.
func TestUserIdentityHeaders(t *testing.T) {
	port := backend(t)
	g, ts, sb := newTestGateway(t, "")
	_, priv, _ := ed25519.GenerateKey(nil)
	ids, err := jwtkeys.New(priv, ts.URL+"/")
	if err != nil {
		t.Fatal(err)
	}
	g.cfg.Identity = ids
	g.cfg.Users = fakeUsers{"alice": {ID: "alice", WorkspaceID: "w", Name: "Alice", Email: "alice@example.com"}}
	spoof := http.Header{"X-Langsmith-User-Id": {"evil"}, "x-langsmith-user-email": {"evil@x"}, "X-LANGSMITH-USER-TOKEN": {"forged"}}

	link, _ := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	hdr := spoof.Clone()
	hdr.Set(protocol.ServiceTokenHeader, link.Token)
	resp, e := get(t, http.DefaultClient, link.ServiceURL+"/", hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("token mode: %d", resp.StatusCode)
	}
	for k := range e.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-langsmith-user-") {
			t.Errorf("token mode forwarded %s: %v", k, e.Header[k])
		}
	}
	if got := resp.Header.Get("Content-Security-Policy"); got != "frame-ancestors 'none'" {
		t.Errorf("CSP without embed origins: %q", got)
	}

	ll := g.GrantLogin(context.Background(), sb, port, protocol.AccessRestricted, nil)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	if resp, _ := get(t, c, ll.BrowserURL, http.Header{"X-Api-Key": {"alice-key"}}); resp.StatusCode != 200 {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	u0, _ := url.Parse(ll.ServiceURL)
	resp, e = get(t, c, ll.ServiceURL+"/x", spoof)
	if resp.StatusCode != 200 {
		t.Fatalf("login session: %d", resp.StatusCode)
	}
	if e.Host != u0.Host {
		t.Errorf("the service saw Host %q, want the one it was reached by (%s)", e.Host, u0.Host)
	}
	if e.Header.Get(UserIDHeader) != "alice" || e.Header.Get(UserEmailHeader) != "alice@example.com" || len(e.Header.Values(UserIDHeader)) != 1 {
		t.Fatalf("identity headers: %v", e.Header)
	}
	u, _ := url.Parse(ts.URL)
	claims, err := jwtkeystest.Verify(ids.JWKS(), e.Header.Get(UserTokenHeader), u.Host)
	if err != nil {
		t.Fatalf("user token: %v", err)
	}
	if claims["sub"] != "alice" || claims["email"] != "alice@example.com" || claims["name"] != "Alice" || claims["iss"] != ts.URL {
		t.Errorf("claims %v", claims)
	}
	if ttl := claims["exp"].(float64) - claims["iat"].(float64); ttl != UserTokenTTL.Seconds() {
		t.Errorf("token lifetime %vs", ttl)
	}
}

// TestEmbedURL: a token with embed origins opens through embed_url in a
// frame, and the service's responses may be framed by those origins only.
func TestEmbedURL(t *testing.T) {
	port := backend(t)
	g, ts, sb := newTestGateway(t, "")
	origins := []string{"https://app.example", "http://localhost:3000"}
	link, err := g.IssueService(context.Background(), sb, port, time.Minute, origins)
	if err != nil {
		t.Fatal(err)
	}
	page, tok, ok := strings.Cut(link.EmbedURL, "#token=")
	if !ok || page != ts.URL+embedPath {
		t.Fatalf("embed_url %s", link.EmbedURL)
	}
	pr, err := http.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	pr.Body.Close()
	if pr.StatusCode != 200 || pr.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("embed page: %d", pr.StatusCode)
	}
	tok, _ = url.QueryUnescape(tok)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, err := c.PostForm(page, url.Values{"token": {tok}, "redirect": {"/app?x=1"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Request.URL.Path != "/s/"+sb.ID+fmt.Sprintf("/%d/app", port) || resp.Request.URL.RawQuery != "x=1" {
		t.Fatalf("embed post ended at %d %s", resp.StatusCode, resp.Request.URL)
	}
	if got := resp.Header.Values("Content-Security-Policy"); len(got) != 2 || got[0] != "default-src 'self'" || got[1] != "frame-ancestors https://app.example http://localhost:3000" {
		t.Errorf("CSP %q, want the app's own and the gateway's", got)
	}
	for name, form := range map[string]url.Values{
		"no embed origins": {"token": {mustIssue(t, g, sb, port)}},
		"offsite redirect": {"token": {tok}, "redirect": {"//evil.example/"}},
		"bad token":        {"token": {"x"}},
	} {
		resp, err := http.PostForm(page, form)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("%s: %d", name, resp.StatusCode)
		}
	}
}

func mustIssue(t *testing.T, g *Gateway, sb *store.Sandbox, port int) string {
	l, err := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l.Token
}

// TestLoginEmbed: a login grant's embed origins may frame its login page
// and the service behind it; a grant without them may be framed by nobody.
func TestLoginEmbed(t *testing.T) {
	port := backend(t)
	g, _, sb := newTestGateway(t, "")
	for _, c := range []struct {
		embed []string
		want  string
	}{
		{nil, "frame-ancestors 'none'"},
		{[]string{"https://app.example"}, "frame-ancestors https://app.example"},
	} {
		ll := g.GrantLogin(context.Background(), sb, port, protocol.AccessWorkspace, c.embed)
		page, err := http.Get(ll.BrowserURL)
		if err != nil {
			t.Fatal(err)
		}
		page.Body.Close()
		if got := page.Header.Get("Content-Security-Policy"); !strings.HasSuffix(got, c.want) || page.Header.Get("X-Frame-Options") != "" {
			t.Errorf("login page of a grant with %v: CSP %q", c.embed, got)
		}
		jar, _ := cookiejar.New(nil)
		resp, _ := get(t, &http.Client{Jar: jar}, ll.BrowserURL, http.Header{"X-Api-Key": {"bob-key"}})
		if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") != c.want {
			t.Errorf("service behind a grant with %v: %d CSP %q", c.embed, resp.StatusCode, resp.Header.Get("Content-Security-Policy"))
		}
	}
}

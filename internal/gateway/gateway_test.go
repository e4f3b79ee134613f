package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func testSigner(t *testing.T) *Signer {
	s, err := NewSigner([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestTokenRoundTripAndRejections(t *testing.T) {
	s := testSigner(t)
	c := Claims{Audience: AudienceService, Workspace: "w", Sandbox: "sb", Port: 80, Expires: time.Now().Add(time.Hour).Unix()}
	tok, err := s.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Verify(tok, AudienceService)
	if err != nil || got.Sandbox != "sb" || got.Port != 80 || got.ID == "" {
		t.Fatalf("verify: %+v %v", got, err)
	}
	other, _ := NewSigner([]byte(strings.Repeat("x", 32)))
	h, rest, _ := strings.Cut(tok, ".")
	body, _, _ := strings.Cut(rest, ".")
	expired, _ := s.Sign(Claims{Audience: AudienceService, Expires: time.Now().Add(-time.Second).Unix()})
	forged, _ := other.Sign(c)
	for name, bad := range map[string]string{
		"empty":     "",
		"garbage":   "a.b.c",
		"tampered":  h + "." + body + "x." + strings.Split(tok, ".")[2],
		"alg none":  "eyJhbGciOiJub25lIn0." + body + ".",
		"other key": forged,
		"expired":   expired,
	} {
		if _, err := s.Verify(bad, AudienceService); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("%s: got %v, want ErrUnauthorized", name, err)
		}
	}
	if _, err := s.Verify(tok, AudienceDownload); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Errorf("service token accepted as a download token: %v", err)
	}
}

func TestLoadOrCreateKey(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "sub", "signing.key")
	k1, err := LoadOrCreateKey(ctx, p, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi.Mode(), err)
	}
	k2, err := LoadOrCreateKey(ctx, p, slog.Default())
	if err != nil || string(k1) != string(k2) || len(k1) < 32 {
		t.Fatalf("reload gave a different key: %v", err)
	}
}

// fakeSandboxes serves every sandbox at 127.0.0.1. shared is the access
// shares grant each user (on every sandbox).
type fakeSandboxes struct {
	sbs    map[string]*store.Sandbox
	mu     sync.Mutex
	shared map[string]authz.Access
}

func (f *fakeSandboxes) SandboxAccess(_ context.Context, p auth.Principal, sb *store.Sandbox) (authz.Owned, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o := authz.Sandbox(sb)
	o.Shared = f.shared[p.User]
	return o, nil
}

func (f *fakeSandboxes) share(user string, a authz.Access) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shared == nil {
		f.shared = map[string]authz.Access{}
	}
	f.shared[user] = a
}

func (f *fakeSandboxes) Resolve(ctx context.Context, ws, ref string) (*store.Sandbox, error) {
	for _, sb := range f.sbs {
		if sb.WorkspaceID == ws && (sb.ID == ref || sb.Name == ref) {
			return sb, nil
		}
	}
	return nil, fmt.Errorf("sandbox %s: %w", ref, errdefs.ErrNotFound)
}

func (f *fakeSandboxes) Address(ctx context.Context, id string) (netip.Addr, <-chan struct{}, error) {
	return netip.MustParseAddr("127.0.0.1"), make(chan struct{}), nil
}

func (f *fakeSandboxes) Acquire(id string) func() { return func() {} }

type fakeAuth map[string]auth.Principal

func (a fakeAuth) Authenticate(ctx context.Context, key string) (auth.Principal, error) {
	if p, ok := a[key]; ok {
		return p, nil
	}
	return auth.Principal{}, fmt.Errorf("bad key: %w", errdefs.ErrUnauthorized)
}

func writeErr(ctx context.Context, w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errdefs.ErrUnauthorized):
		status = http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrForbidden):
		status = http.StatusForbidden
	case errors.Is(err, errdefs.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errdefs.ErrUnavailable):
		status = http.StatusBadGateway
	}
	http.Error(w, err.Error(), status)
}

// appCSP is the Content-Security-Policy backend's /app sets.
const appCSP = "default-src 'self'"

// backend echoes what it received as JSON, and WebSocket messages at /ws.
func backend(t *testing.T) (port int) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, data, err := c.Read(r.Context())
			if err != nil {
				return
			}
			c.Write(r.Context(), typ, data)
		}
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/app" {
			w.Header().Set("Content-Security-Policy", appCSP)
		}
		json.NewEncoder(w).Encode(map[string]any{"host": r.Host, "path": r.URL.Path, "query": r.URL.RawQuery, "header": r.Header})
	})
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	_, p, _ := net.SplitHostPort(ts.Listener.Addr().String())
	port, _ = strconv.Atoi(p)
	return port
}

func newTestGateway(t *testing.T, domain string) (*Gateway, *httptest.Server, *store.Sandbox) {
	sb := &store.Sandbox{ID: "0b5a3b6e-1111-4222-8333-444455556666", Name: "box", WorkspaceID: "w", CreatedBy: "alice"}
	var g *Gateway
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.ServeHTTP(w, r) }))
	t.Cleanup(ts.Close)
	var err error
	g, err = New(Config{PublicURL: ts.URL, ServiceDomain: domain, Signer: testSigner(t),
		Sandboxes:  &fakeSandboxes{sbs: map[string]*store.Sandbox{sb.ID: sb}},
		Auth:       fakeAuth{"alice-key": {WorkspaceID: "w", User: "alice"}, "bob-key": {WorkspaceID: "w", User: "bob"}, "eve-key": {WorkspaceID: "x", User: "eve"}},
		WriteError: writeErr})
	if err != nil {
		t.Fatal(err)
	}
	return g, ts, sb
}

type echo struct {
	Host   string
	Path   string
	Query  string
	Header http.Header
}

func get(t *testing.T, c *http.Client, u string, hdr http.Header) (*http.Response, echo) {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e echo
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		if err := json.Unmarshal(body, &e); err != nil {
			t.Fatalf("%s: %v: %s", u, err, body)
		}
	}
	return resp, e
}

func TestServiceTokenPathForm(t *testing.T) {
	port := backend(t)
	g, _, sb := newTestGateway(t, "")
	link, err := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	hdr := http.Header{protocol.ServiceTokenHeader: {link.Token}, "X-Api-Key": {"secret"}, "Cookie": {"app=1; " + cookieName + "=" + link.Token}}
	resp, e := get(t, http.DefaultClient, link.ServiceURL+"/a/b%2Fc?q=1", hdr)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if e.Path != "/a/b/c" || e.Query != "q=1" {
		t.Errorf("forwarded %q ? %q", e.Path, e.Query)
	}
	if e.Header.Get(protocol.ServiceTokenHeader) != "" || e.Header.Get("X-Api-Key") != "" || e.Header.Get("Cookie") != "app=1" {
		t.Errorf("credentials reached the service: %v", e.Header)
	}
	if e.Header.Get("X-Forwarded-Prefix") != "/s/"+sb.ID+"/"+strconv.Itoa(port) {
		t.Errorf("X-Forwarded-Prefix = %q", e.Header.Get("X-Forwarded-Prefix"))
	}
	// Wrong port, no token, bad token, other sandbox.
	other, _ := g.IssueService(context.Background(), sb, port+1, time.Minute, nil)
	for name, h := range map[string]http.Header{
		"none":       nil,
		"garbage":    {protocol.ServiceTokenHeader: {"nope"}},
		"other port": {protocol.ServiceTokenHeader: {other.Token}},
	} {
		if resp, _ := get(t, http.DefaultClient, link.ServiceURL+"/", h); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: status %d, want 401", name, resp.StatusCode)
		}
	}
	foreign := strings.Replace(link.ServiceURL, sb.ID, "other-box", 1)
	if resp, _ := get(t, http.DefaultClient, foreign+"/", hdr); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("foreign sandbox: status %d, want 401", resp.StatusCode)
	}
}

func TestBrowserURLSetsCookie(t *testing.T) {
	port := backend(t)
	g, _, sb := newTestGateway(t, "")
	link, _ := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	resp, e := get(t, c, link.BrowserURL, nil)
	if resp.StatusCode != 200 || e.Path != "/" || e.Query != "" {
		t.Fatalf("browser_url: %d %+v", resp.StatusCode, e)
	}
	if e.Header.Get("Cookie") != "" {
		t.Errorf("token cookie reached the service: %q", e.Header.Get("Cookie"))
	}
	if resp, _ := get(t, c, link.ServiceURL+"/x", nil); resp.StatusCode != 200 {
		t.Errorf("cookie did not authorize a later request: %d", resp.StatusCode)
	}
	u, _ := url.Parse(link.ServiceURL + "/")
	if cs := jar.Cookies(u); len(cs) != 1 || cs[0].Name != cookieName {
		t.Errorf("cookies: %v", cs)
	}
}

func TestHostFormAndWebSocket(t *testing.T) {
	port := backend(t)
	g, ts, sb := newTestGateway(t, "svc.test")
	link, _ := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	want := fmt.Sprintf("box--%d.svc.test", port)
	if !strings.Contains(link.ServiceURL, want) {
		t.Fatalf("service URL %s lacks host %s", link.ServiceURL, want)
	}
	// Dial the test server whatever the host name says.
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, ts.Listener.Addr().String())
	}
	c := &http.Client{Transport: &http.Transport{DialContext: dial}}
	resp, e := get(t, c, link.ServiceURL+"/hello", http.Header{protocol.ServiceTokenHeader: {link.Token}})
	if resp.StatusCode != 200 || e.Path != "/hello" {
		t.Fatalf("host form: %d %+v", resp.StatusCode, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws := strings.Replace(link.ServiceURL, "http", "ws", 1) + "/ws"
	conn, _, err := websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPClient: c, HTTPHeader: http.Header{protocol.ServiceTokenHeader: {link.Token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	conn.Write(ctx, websocket.MessageText, []byte("ping"))
	if _, data, err := conn.Read(ctx); err != nil || string(data) != "ping" {
		t.Fatalf("echo: %q %v", data, err)
	}
}

func TestLoginMode(t *testing.T) {
	port := backend(t)
	g, _, sb := newTestGateway(t, "")
	ll := g.GrantLogin(context.Background(), sb, port, protocol.AccessRestricted, nil)
	if _, err := g.IssueService(context.Background(), sb, port, time.Minute, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("token mode on a login port: %v, want conflict", err)
	}
	var session *http.Client
	login := func(key string) (int, echo) {
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar}
		resp, e := get(t, c, ll.BrowserURL, http.Header{"X-Api-Key": {key}})
		if resp.StatusCode == 200 {
			if r2, _ := get(t, c, ll.ServiceURL+"/again", nil); r2.StatusCode != 200 {
				t.Errorf("login cookie did not stick: %d", r2.StatusCode)
			}
		}
		session = c
		return resp.StatusCode, e
	}
	if code, e := login("alice-key"); code != 200 || e.Header.Get("X-Api-Key") != "" {
		t.Errorf("creator login: %d %v", code, e.Header)
	}
	if code, _ := login("bob-key"); code != http.StatusNotFound {
		t.Errorf("restricted, a user with no access: %d, want 404 (as for no sandbox)", code)
	}
	fake := g.cfg.Sandboxes.(*fakeSandboxes)
	fake.share("bob", authz.Read)
	if code, _ := login("bob-key"); code != 200 {
		t.Errorf("restricted, a user with a read share: %d, want 200", code)
	}
	// An open WebSocket of the session ends when Reauthorize finds the
	// share gone; one of the creator's session stays.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, strings.Replace(ll.ServiceURL, "http", "ws", 1)+"/ws", &websocket.DialOptions{HTTPClient: session})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	fake.share("bob", authz.None)
	g.Reauthorize(ctx)
	start := time.Now()
	if _, _, err := ws.Read(ctx); err == nil || time.Since(start) > 2*time.Second {
		t.Errorf("the session's WebSocket outlived the revocation: %v after %v", err, time.Since(start))
	}
	fake.share("bob", authz.Read)
	if code, _ := login("bob-key"); code != 200 {
		t.Errorf("login again: %d", code)
	}
	// Revoking the share ends bob's session at its next request.
	fake.share("bob", authz.None)
	if r, _ := get(t, session, ll.ServiceURL+"/after", nil); r.StatusCode != http.StatusNotFound {
		t.Errorf("session after revocation: %d, want 404", r.StatusCode)
	}
	g.GrantLogin(context.Background(), sb, port, protocol.AccessWorkspace, nil)
	if code, _ := login("bob-key"); code != 200 {
		t.Errorf("workspace, other user: %d, want 200", code)
	}
	if code, _ := login("eve-key"); code != http.StatusNotFound {
		t.Errorf("other workspace: %d, want 404", code)
	}
	// A browser with no credential is sent to the login page.
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, _ := get(t, c, ll.ServiceURL+"/", http.Header{"Accept": {"text/html"}})
	if resp.StatusCode != http.StatusSeeOther || !strings.Contains(resp.Header.Get("Location"), "/s/login?") {
		t.Errorf("browser without login: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
}

func TestLoadKeyRefusesLooseMode(t *testing.T) {
	p := filepath.Join(t.TempDir(), "signing.key")
	if err := os.WriteFile(p, []byte(strings.Repeat("ab", 32)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(context.Background(), p, slog.Default()); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("loose key file accepted: %v", err)
	}
}

// TestStreamingFlushes checks that a streamed response reaches the client
// chunk by chunk (FlushInterval -1), not when the service finishes.
func TestStreamingFlushes(t *testing.T) {
	release := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, "data: second\n\n")
	}))
	defer ts.Close()
	defer close(release)
	_, p, _ := net.SplitHostPort(ts.Listener.Addr().String())
	port, _ := strconv.Atoi(p)
	g, _, sb := newTestGateway(t, "")
	link, _ := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	req, _ := http.NewRequest(http.MethodGet, link.ServiceURL+"/events", nil)
	req.Header.Set(protocol.ServiceTokenHeader, link.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	done := make(chan string, 1)
	go func() {
		n, _ := resp.Body.Read(buf)
		done <- string(buf[:n])
	}()
	select {
	case got := <-done:
		if got != "data: first\n\n" {
			t.Fatalf("first chunk %q", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first event held back until the stream ends")
	}
}

// TestHostileServiceCannotPlantTokenCookie: path-form services share the
// daemon's origin, so a service's Set-Cookie for the gateway's token cookie
// (any Domain, Path or case) would land in the browser for every sandbox:
// the gateway drops it and passes the service's own cookies. The gateway's
// cookie is scoped to /s/<id>/<port>/, even when the link used the name.
func TestHostileServiceCannotPlantTokenCookie(t *testing.T) {
	planted := []string{
		cookieName + "=planted; Path=/",
		cookieName + "=planted; Path=/s/; Domain=127.0.0.1",
		" " + strings.ToUpper(cookieName) + " = planted",
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		for _, c := range planted {
			w.Header().Add("Set-Cookie", c)
		}
		w.Header().Add("Set-Cookie", "app=1; Path=/")
		json.NewEncoder(w).Encode(map[string]any{"host": r.Host, "path": r.URL.Path, "header": r.Header})
	})
	hostile := httptest.NewServer(mux)
	defer hostile.Close()
	_, p, _ := net.SplitHostPort(hostile.Listener.Addr().String())
	port, _ := strconv.Atoi(p)
	g, _, sb := newTestGateway(t, "")
	other := &store.Sandbox{ID: "7c0d2a51-aaaa-4bbb-8ccc-ddddeeeeffff", Name: "other", WorkspaceID: "w", CreatedBy: "alice"}
	g.cfg.Sandboxes.(*fakeSandboxes).sbs[other.ID] = other
	link, err := g.IssueService(context.Background(), sb, port, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	byName := strings.Replace(link.BrowserURL, "/s/"+sb.ID+"/", "/s/"+sb.Name+"/", 1)
	resp, e := get(t, c, byName, nil)
	if resp.StatusCode != 200 || resp.Request.URL.Path != "/s/"+sb.ID+"/"+p+"/" || e.Path != "/" {
		t.Fatalf("browser_url by name: %d, landed on %s, service saw %q", resp.StatusCode, resp.Request.URL.Path, e.Path)
	}
	if got := resp.Header.Values("Set-Cookie"); len(got) != 1 || got[0] != "app=1; Path=/" {
		t.Errorf("Set-Cookie relayed from the service: %q", got)
	}
	base, _ := url.Parse(link.ServiceURL)
	for path, want := range map[string]int{
		"/s/" + sb.ID + "/" + p + "/":      1, // the gateway's own cookie
		"/s/" + sb.Name + "/" + p + "/":    0,
		"/s/" + other.ID + "/" + p + "/":   0,
		"/s/" + sb.ID + "/" + p + "1/":     0,
		"/s/" + other.Name + "/" + p + "/": 0,
	} {
		n := 0
		for _, ck := range jar.Cookies(base.ResolveReference(&url.URL{Path: path})) {
			if strings.EqualFold(ck.Name, cookieName) {
				if ck.Value == "planted" {
					t.Errorf("%s: planted token cookie", path)
				}
				n++
			}
		}
		if n != want {
			t.Errorf("%s: %d token cookies, want %d", path, n, want)
		}
	}
}

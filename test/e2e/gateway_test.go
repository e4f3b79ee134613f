package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// serviceDomain is the host-form domain the gateway tests run the daemon
// with; requests reach it by dialing the daemon with a matching Host.
const serviceDomain = "svc.test"

const (
	indexHTML = "hello from inside the sandbox\n"
	// envCGI dumps the request as busybox httpd hands it to CGI, so the
	// test can see exactly which headers reached the service.
	envCGI = "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\nenv\n"
)

// gatewayFixture is a daemon with the host form enabled and one sandbox
// serving /www with busybox httpd on port 8000.
type gatewayFixture struct {
	d  *daemon
	sb *protocol.Sandbox
}

// startGatewayFixture starts the fixture; domain "" runs the daemon with the
// path form only. The daemon reads the domain from CUBICLE_SERVICE_DOMAIN.
func startGatewayFixture(t testing.TB, runtime, domain string) *gatewayFixture {
	if tt, ok := t.(*testing.T); ok {
		tt.Setenv("CUBICLE_SERVICE_DOMAIN", domain)
	} else {
		os.Setenv("CUBICLE_SERVICE_DOMAIN", domain)
		t.Cleanup(func() { os.Unsetenv("CUBICLE_SERVICE_DOMAIN") })
	}
	ref := testImage(t)
	d := startDaemon(t, runtime, "")
	sn := readySnapshot(t, d.Client, "gw", ref)
	sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "web" })
	ctx := context.Background()
	for p, data := range map[string]string{"/www/index.html": indexHTML, "/www/cgi-bin/env.cgi": envCGI} {
		if err := d.Client.WriteFile(ctx, sb.Name, p, strings.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	startHTTPD(t, d, sb.Name)
	return &gatewayFixture{d: d, sb: sb}
}

// startHTTPD runs busybox httpd on :8000 (it daemonizes, so the exec ends).
func startHTTPD(t testing.TB, d *daemon, name string) {
	mustRun(t, d.Client, name, "chmod 755 /www/cgi-bin/env.cgi && busybox httpd -p 8000 -h /www </dev/null >/dev/null 2>&1")
}

// serviceURL asks for a token-mode service URL.
func (f *gatewayFixture) serviceURL(t testing.TB, name string, port int, ttl *int64) *protocol.ServiceURLResponse {
	su, err := f.d.Client.ServiceURL(context.Background(), name, protocol.ServiceURLRequest{Port: port, ExpiresInSeconds: ttl})
	if err != nil {
		t.Fatalf("service-url: %v", err)
	}
	return su
}

// fetch GETs u with hdr and returns status and body.
func fetch(t testing.TB, c *http.Client, method, u string, hdr http.Header) (*http.Response, string) {
	req, err := http.NewRequest(method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// waitServing polls the service until it answers 200 (httpd takes a moment).
func waitServing(t testing.TB, u, token string) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, body := fetch(t, http.DefaultClient, http.MethodGet, u, http.Header{protocol.ServiceTokenHeader: {token}})
		if resp.StatusCode == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("service at %s never came up: %d %s", u, resp.StatusCode, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostClient dials the daemon whatever host a URL names, as wildcard DNS
// for the service domain would.
func hostClient(d *daemon, jar http.CookieJar) *http.Client {
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, d.listen)
	}
	return &http.Client{Jar: jar, Transport: &http.Transport{DialContext: dial}}
}

func TestGatewayServiceURL(t *testing.T) {
	f := startGatewayFixture(t, "gvisor", serviceDomain)
	su := f.serviceURL(t, f.sb.Name, 8000, nil)
	if !strings.Contains(su.ServiceURL, "web--8000."+serviceDomain) || su.Token == "" {
		t.Fatalf("service URL %+v", su)
	}
	if exp, err := time.Parse(time.RFC3339, su.ExpiresAt); err != nil || time.Until(exp) < 50*time.Minute {
		t.Fatalf("expires_at %q: %v", su.ExpiresAt, err)
	}
	// The path form reaches the same service on the API host.
	pathBase := f.d.Endpoint + "/s/" + f.sb.ID + "/8000"
	waitServing(t, pathBase+"/", su.Token)
	hc := hostClient(f.d, nil)
	auth := http.Header{protocol.ServiceTokenHeader: {su.Token}}

	t.Run("token header", func(t *testing.T) {
		for _, base := range []string{su.ServiceURL, pathBase} {
			resp, body := fetch(t, hc, http.MethodGet, base+"/index.html", auth)
			if resp.StatusCode != 200 || body != indexHTML {
				t.Errorf("%s: %d %q", base, resp.StatusCode, body)
			}
		}
	})
	t.Run("credentials stripped", func(t *testing.T) {
		hdr := http.Header{protocol.ServiceTokenHeader: {su.Token}, "X-Api-Key": {testKey}, "Cookie": {"app=kept; cubicle_service_token=" + su.Token}}
		resp, body := fetch(t, hc, http.MethodGet, su.ServiceURL+"/cgi-bin/env.cgi", hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("cgi: %d %s", resp.StatusCode, body)
		}
		if strings.Contains(body, "HTTP_X_LANGSMITH_SANDBOX_SERVICE_TOKEN") || strings.Contains(body, su.Token) || strings.Contains(body, testKey) {
			t.Errorf("a credential reached the service:\n%s", body)
		}
		if !strings.Contains(body, "app=kept") {
			t.Errorf("the service's own cookie was dropped:\n%s", body)
		}
	})
	t.Run("browser url", func(t *testing.T) {
		jar, _ := cookiejar.New(nil)
		c := hostClient(f.d, jar)
		resp, body := fetch(t, c, http.MethodGet, su.BrowserURL, nil)
		if resp.StatusCode != 200 || !strings.Contains(body, indexHTML) {
			t.Fatalf("browser_url: %d %q", resp.StatusCode, body)
		}
		if strings.Contains(resp.Request.URL.RawQuery, "token") {
			t.Errorf("token left in the URL after the redirect: %s", resp.Request.URL)
		}
		resp, body = fetch(t, c, http.MethodGet, su.ServiceURL+"/cgi-bin/env.cgi", nil)
		if resp.StatusCode != 200 || strings.Contains(body, su.Token) {
			t.Errorf("cookie request: %d, token visible inside: %v", resp.StatusCode, strings.Contains(body, su.Token))
		}
	})
	t.Run("rejected tokens", func(t *testing.T) {
		short := f.serviceURL(t, f.sb.Name, 8000, int64p(1))
		otherPort := f.serviceURL(t, f.sb.Name, 8001, nil)
		other := newSandbox(t, f.d.Client, f.sb.SnapshotID, func(r *protocol.CreateSandboxRequest) { r.Name = "other" })
		foreign := f.serviceURL(t, other.Name, 8000, nil)
		time.Sleep(1100 * time.Millisecond)
		for name, tok := range map[string]string{"none": "", "malformed": "x.y.z", "expired": short.Token,
			"other port": otherPort.Token, "other sandbox": foreign.Token} {
			hdr := http.Header{}
			if tok != "" {
				hdr.Set(protocol.ServiceTokenHeader, tok)
			}
			for _, base := range []string{su.ServiceURL, pathBase} {
				resp, body := fetch(t, hc, http.MethodGet, base+"/index.html", hdr)
				if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `"detail"`) {
					t.Errorf("%s at %s: %d %s", name, base, resp.StatusCode, body)
				}
			}
		}
	})
	t.Run("validation", func(t *testing.T) {
		for _, req := range []protocol.ServiceURLRequest{{Port: 0}, {Port: 65536}, {Port: 80, Access: "public"},
			{Port: 80, Access: protocol.AccessWorkspace, ExpiresInSeconds: int64p(60)}} {
			_, err := f.d.Client.ServiceURL(context.Background(), f.sb.Name, req)
			if !isStatus(err, 422) {
				t.Errorf("%+v: %v, want 422", req, err)
			}
		}
	})
	t.Run("websocket", func(t *testing.T) { testGatewayWebSocket(t, f) })
	t.Run("login mode", func(t *testing.T) { testGatewayLogin(t, f) })
}

func isStatus(err error, status int) bool {
	var ae *cubicle.APIError
	return errors.As(err, &ae) && ae.Status == status
}

// testGatewayWebSocket runs a static Go echo server in the sandbox and
// talks to it through the gateway.
func testGatewayWebSocket(t *testing.T, f *gatewayFixture) {
	bin := filepath.Join(t.TempDir(), "wsecho")
	build := exec.Command("go", "build", "-o", bin, "./test/e2e/testdata/wsecho")
	build.Dir, build.Env = repoRoot(t), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build wsecho: %v\n%s", err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.d.Client.WriteFile(context.Background(), f.sb.Name, "/usr/local/bin/wsecho", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	// setsid: the agent ends a finished command's process group.
	mustRun(t, f.d.Client, f.sb.Name, "chmod 755 /usr/local/bin/wsecho && setsid wsecho :9000 </dev/null >/dev/null 2>&1 &")
	su := f.serviceURL(t, f.sb.Name, 9000, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conn *websocket.Conn
	for {
		conn, _, err = websocket.Dial(ctx, strings.Replace(su.ServiceURL, "http", "ws", 1)+"/echo",
			&websocket.DialOptions{HTTPClient: hostClient(f.d, nil), HTTPHeader: http.Header{protocol.ServiceTokenHeader: {su.Token}}})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("dial echo server through the gateway: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	for _, msg := range []string{"hello", strings.Repeat("x", 100000)} {
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		if _, got, err := conn.Read(ctx); err != nil || string(got) != msg {
			t.Fatalf("echo of %d bytes: got %d bytes, %v", len(msg), len(got), err)
		}
	}
	conn.Close(websocket.StatusNormalClosure, "")
}

// testGatewayLogin covers login mode: a grant, the 409 for token mode on
// that port, and a login with an API key through a cookie jar.
func testGatewayLogin(t *testing.T, f *gatewayFixture) {
	ctx := context.Background()
	lu, err := f.d.Client.ServiceURL(ctx, f.sb.Name, protocol.ServiceURLRequest{Port: 8000, Access: protocol.AccessRestricted})
	if err != nil || lu.Access != protocol.AccessRestricted || lu.BrowserURL == "" || lu.Token != "" {
		t.Fatalf("login-mode service-url: %+v %v", lu, err)
	}
	if _, err := f.d.Client.ServiceURL(ctx, f.sb.Name, protocol.ServiceURLRequest{Port: 8000}); !isStatus(err, 409) {
		t.Fatalf("token mode on a login port: %v, want 409", err)
	}
	jar, _ := cookiejar.New(nil)
	c := hostClient(f.d, jar)
	if resp, _ := fetch(t, c, http.MethodGet, lu.BrowserURL, http.Header{"X-Api-Key": {"wrong"}}); resp.StatusCode != 401 {
		t.Errorf("login with a bad key: %d", resp.StatusCode)
	}
	resp, body := fetch(t, c, http.MethodGet, lu.BrowserURL, http.Header{"X-Api-Key": {testKey}})
	if resp.StatusCode != 200 || body != indexHTML {
		t.Fatalf("login: %d %q", resp.StatusCode, body)
	}
	if resp, body := fetch(t, c, http.MethodGet, lu.ServiceURL+"/index.html", nil); resp.StatusCode != 200 || body != indexHTML {
		t.Errorf("after login: %d %q", resp.StatusCode, body)
	}
}

func TestGatewayDownloadURL(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "dl", ref)
	sb := newSandbox(t, d.Client, sn.ID, nil)
	ctx := context.Background()
	data := make([]byte, 200000)
	rand.Read(data)
	for p, b := range map[string][]byte{"/data/blob.bin": data, "/data/secret.txt": []byte("not for the link")} {
		if err := d.Client.WriteFile(ctx, sb.Name, p, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}
	link := func(req protocol.DownloadURLRequest) *protocol.DownloadURLResponse {
		l, err := d.Client.DownloadURL(ctx, sb.Name, req)
		if err != nil {
			t.Fatalf("download-url %+v: %v", req, err)
		}
		return l
	}
	l := link(protocol.DownloadURLRequest{Path: "/data/blob.bin", ContentType: "application/x-test", ContentDisposition: "attachment"})
	if l.ExpiresAt != nil || !strings.Contains(l.DownloadURL, l.Token) {
		t.Fatalf("link %+v", l)
	}
	c := http.DefaultClient

	resp, body := fetch(t, c, http.MethodGet, l.DownloadURL, nil)
	if resp.StatusCode != 200 || body != string(data) {
		t.Fatalf("GET: %d, %d bytes", resp.StatusCode, len(body))
	}
	if ct, cd := resp.Header.Get("Content-Type"), resp.Header.Get("Content-Disposition"); ct != "application/x-test" || cd != `attachment; filename=blob.bin` {
		t.Errorf("pinned headers: %q %q", ct, cd)
	}
	resp, body = fetch(t, c, http.MethodGet, l.DownloadURL, http.Header{"Range": {"bytes=100-199"}})
	if resp.StatusCode != 206 || body != string(data[100:200]) || !strings.HasPrefix(resp.Header.Get("Content-Range"), "bytes 100-199/200000") {
		t.Errorf("Range: %d %q", resp.StatusCode, resp.Header.Get("Content-Range"))
	}
	resp, _ = fetch(t, c, http.MethodHead, l.DownloadURL, nil)
	if resp.StatusCode != 200 || resp.ContentLength != int64(len(data)) || resp.Header.Get("ETag") == "" {
		t.Errorf("HEAD: %d length %d etag %q", resp.StatusCode, resp.ContentLength, resp.Header.Get("ETag"))
	}
	// The token pins the path: a query cannot redirect it, an edit breaks it.
	if _, body := fetch(t, c, http.MethodGet, l.DownloadURL+"?path=/data/secret.txt", nil); body != string(data) {
		t.Errorf("?path= changed what the link reads")
	}
	if resp, _ := fetch(t, c, http.MethodGet, l.DownloadURL[:len(l.DownloadURL)-2]+"xx", nil); resp.StatusCode != 401 {
		t.Errorf("tampered token: %d", resp.StatusCode)
	}
	short := link(protocol.DownloadURLRequest{Path: "/data/blob.bin", ExpiresInSeconds: int64p(1)})
	if short.ExpiresAt == nil {
		t.Fatal("expiring link has no expires_at")
	}
	time.Sleep(1100 * time.Millisecond)
	if resp, _ := fetch(t, c, http.MethodGet, short.DownloadURL, nil); resp.StatusCode != 401 {
		t.Errorf("expired link: %d", resp.StatusCode)
	}
	missing := link(protocol.DownloadURLRequest{Path: "/data/nope"})
	if resp, _ := fetch(t, c, http.MethodGet, missing.DownloadURL, nil); resp.StatusCode != 404 {
		t.Errorf("missing file: %d", resp.StatusCode)
	}
	for _, req := range []protocol.DownloadURLRequest{{}, {Path: "rel"}, {Path: "/x", ExpiresInSeconds: int64p(0)},
		{Path: "/x", ContentDisposition: "evil"}, {Path: "/x", ContentType: "text/plain\r\nX-Evil: 1"}} {
		if _, err := d.Client.DownloadURL(ctx, sb.Name, req); !isStatus(err, 422) {
			t.Errorf("%+v: %v, want 422", req, err)
		}
	}
	// A link wakes a stopped sandbox.
	if err := d.Client.StopSandbox(ctx, sb.Name); err != nil {
		t.Fatal(err)
	}
	resp, body = fetch(t, c, http.MethodGet, l.DownloadURL, nil)
	if resp.StatusCode != 200 || body != string(data) {
		t.Fatalf("GET after stop: %d, %d bytes", resp.StatusCode, len(body))
	}
	if st, err := d.Client.SandboxStatus(ctx, sb.Name); err != nil || st.Status != protocol.StatusReady {
		t.Errorf("status after a link woke it: %+v %v", st, err)
	}
}

// TestGatewayOfficialClientFetch drives ServiceUrl.fetch() of the official
// client: a global fetch with the token header and no API key.
func TestGatewayOfficialClientFetch(t *testing.T) {
	f := startGatewayFixture(t, "gvisor", "") // node resolves real DNS: path form
	dir := npmDir(t, false)
	script, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "e2e", "testdata", "service-fetch.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "service-fetch.mjs")
	if err := os.WriteFile(dst, script, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+f.d.Endpoint, "LANGSMITH_API_KEY="+testKey, "SANDBOX="+f.sb.Name)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "FETCH OK") {
		t.Fatalf("service-fetch.mjs: %v\n%s", err, out)
	}
}

// sandboxIP reads the sandbox's address from the daemon's IPAM records.
func sandboxIP(t testing.TB, d *daemon, id string) string {
	data, err := os.ReadFile(filepath.Join(d.dataDir, "network", strings.ReplaceAll(id, "-", "")+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		SandboxIP string `json:"sandbox_ip"`
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	return rec.SandboxIP
}

// BenchmarkGateway compares a small GET through the service URL (path
// form, token header) with the same GET straight to SandboxIP:8000.
func BenchmarkGateway(b *testing.B) {
	f := startGatewayFixture(b, "gvisor", "")
	su := f.serviceURL(b, f.sb.Name, 8000, nil)
	proxied := f.d.Endpoint + "/s/" + f.sb.ID + "/8000/index.html"
	waitServing(b, proxied, su.Token)
	direct := fmt.Sprintf("http://%s:8000/index.html", sandboxIP(b, f.d, f.sb.ID))
	c := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 4}}
	for _, tc := range []struct{ name, url string }{{"direct", direct}, {"proxied", proxied}} {
		b.Run(tc.name, func(b *testing.B) {
			hdr := http.Header{protocol.ServiceTokenHeader: {su.Token}}
			var ds []time.Duration
			start := time.Now()
			for b.Loop() {
				t0 := time.Now()
				resp, body := fetch(b, c, http.MethodGet, tc.url, hdr)
				ds = append(ds, time.Since(t0))
				if resp.StatusCode != 200 || body != indexHTML {
					b.Fatalf("%d %q", resp.StatusCode, body)
				}
			}
			b.ReportMetric(float64(len(ds))/time.Since(start).Seconds(), "req/s")
			slices.Sort(ds)
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// TestGatewayHostileServiceCookies: a service tries to plant the gateway's
// token cookie for every sandbox of the shared path-form origin (Path=/,
// Domain, odd case); the gateway relays only the service's own cookie, and
// its own cookie stays scoped to /s/<id>/<port>/.
func TestGatewayHostileServiceCookies(t *testing.T) {
	f := startGatewayFixture(t, "namespace", "")
	const evil = "#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n'\n" +
		"printf 'Set-Cookie: cubicle_service_token=planted; Path=/\\r\\n'\n" +
		"printf 'Set-Cookie: Cubicle_Service_Token=planted; Path=/s/; Domain=127.0.0.1\\r\\n'\n" +
		"printf 'Set-Cookie: app=1; Path=/\\r\\n\\r\\n'\necho evil\n"
	ctx := context.Background()
	if err := f.d.Client.WriteFile(ctx, f.sb.Name, "/www/cgi-bin/evil.cgi", strings.NewReader(evil)); err != nil {
		t.Fatal(err)
	}
	mustRun(t, f.d.Client, f.sb.Name, "chmod 755 /www/cgi-bin/evil.cgi")
	su := f.serviceURL(t, f.sb.Name, 8000, nil)
	waitServing(t, su.ServiceURL+"/", su.Token)
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	if resp, _ := fetch(t, c, http.MethodGet, su.BrowserURL, nil); resp.StatusCode != 200 {
		t.Fatalf("browser_url: %d", resp.StatusCode)
	}
	resp, body := fetch(t, c, http.MethodGet, su.ServiceURL+"/cgi-bin/evil.cgi", nil)
	if resp.StatusCode != 200 || body != "evil\n" {
		t.Fatalf("evil.cgi: %d %q", resp.StatusCode, body)
	}
	if got := resp.Header.Values("Set-Cookie"); len(got) != 1 || !strings.HasPrefix(got[0], "app=1") {
		t.Fatalf("Set-Cookie relayed to the browser: %q", got)
	}
	base, _ := url.Parse(f.d.Endpoint)
	own := "/s/" + f.sb.ID + "/8000/"
	for _, p := range []string{own, "/", "/s/" + uuid.NewString() + "/8000/", "/s/" + f.sb.ID + "/8001/"} {
		n := 0
		for _, ck := range jar.Cookies(base.ResolveReference(&url.URL{Path: p})) {
			if strings.EqualFold(ck.Name, "cubicle_service_token") {
				if ck.Value == "planted" {
					t.Fatalf("%s: planted token cookie in the browser", p)
				}
				n++
			}
		}
		if want := map[bool]int{true: 1, false: 0}[p == own]; n != want {
			t.Errorf("%s: %d token cookies, want %d", p, n, want)
		}
	}
}

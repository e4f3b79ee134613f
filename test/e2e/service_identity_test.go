package e2e

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// runNodeScript runs testdata/<script> with the official npm client 0.12
// and env, and returns its output.
func runNodeScript(t *testing.T, script string, env ...string) string {
	t.Helper()
	dir := npmDirVersion(t, "0.12", false)
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "e2e", "testdata", script))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, script)
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s:\n%s", script, out)
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return string(out)
}

// cgiEnv parses the env dump of envCGI.
func cgiEnv(body string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(body, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

// forge re-signs tok's header and claims with a key of its own: the same
// kid, a signature the JWKS key does not make.
func forge(t *testing.T, tok string) string {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", tok)
	}
	_, priv, _ := ed25519.GenerateKey(nil)
	return parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(parts[0]+"."+parts[1])))
}

// TestServiceIdentity: spoofed X-Langsmith-User-* headers never reach the
// app inside the sandbox; after a login-mode grant the app sees the
// logged-in user and a token that the official npm client's
// SandboxTokenVerifier accepts (and a forged one it rejects); embed_origins
// decide who may frame the service.
func TestServiceIdentity(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testServiceIdentity(t, rt) })
	}
}

func testServiceIdentity(t *testing.T, rt string) {
	f := startGatewayFixture(t, rt, "")
	ctx := context.Background()
	root := f.d.Client
	uma, err := root.CreateUser(ctx, protocol.CreateUserRequest{Name: "Uma", Email: "uma@example.com"})
	if err != nil {
		t.Fatal(err)
	}
	umaKey, err := root.CreateKey(ctx, protocol.CreateKeyRequest{Name: "uma", UserID: uma.ID, Role: "member"})
	if err != nil {
		t.Fatal(err)
	}
	spoof := http.Header{"X-Langsmith-User-Id": {"evil"}, "X-Langsmith-User-Email": {"evil@example.com"}, "x-langsmith-user-token": {"evil.token.x"}}

	su, err := root.ServiceURL(ctx, f.sb.Name, protocol.ServiceURLRequest{Port: 8000, EmbedOrigins: []string{"https://App.example/"}})
	if err != nil || su.EmbedURL == "" || len(su.EmbedOrigins) != 1 || su.EmbedOrigins[0] != "https://app.example" {
		t.Fatalf("service-url with embed_origins: %+v %v", su, err)
	}
	waitServing(t, su.ServiceURL+"/", su.Token)
	t.Run("spoofed headers are stripped", func(t *testing.T) {
		hdr := spoof.Clone()
		hdr.Set(protocol.ServiceTokenHeader, su.Token)
		resp, body := fetch(t, http.DefaultClient, http.MethodGet, su.ServiceURL+"/cgi-bin/env.cgi", hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("cgi: %d %s", resp.StatusCode, body)
		}
		if strings.Contains(body, "HTTP_X_LANGSMITH_USER") || strings.Contains(body, "evil") {
			t.Fatalf("spoofed identity reached the app:\n%s", body)
		}
		if got := resp.Header.Get("Content-Security-Policy"); got != "frame-ancestors https://app.example" {
			t.Errorf("CSP of an embeddable service URL: %q", got)
		}
	})

	lu, err := root.ServiceURL(ctx, f.sb.Name, protocol.ServiceURLRequest{Port: 8000, Access: protocol.AccessWorkspace})
	if err != nil {
		t.Fatal(err)
	}
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	if resp, body := fetch(t, c, http.MethodGet, lu.BrowserURL, http.Header{"X-Api-Key": {umaKey.Key}}); resp.StatusCode != 200 {
		t.Fatalf("login: %d %s", resp.StatusCode, body)
	}
	resp, body := fetch(t, c, http.MethodGet, lu.ServiceURL+"/cgi-bin/env.cgi", spoof)
	if resp.StatusCode != 200 {
		t.Fatalf("cgi after login: %d %s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Content-Security-Policy"); got != "frame-ancestors 'none'" {
		t.Errorf("CSP without embed origins: %q", got)
	}
	env := cgiEnv(body)
	if env["HTTP_X_LANGSMITH_USER_ID"] != uma.ID || env["HTTP_X_LANGSMITH_USER_EMAIL"] != "uma@example.com" || strings.Contains(body, "evil") {
		t.Fatalf("identity the app saw:\n%s", body)
	}
	token, host := env["HTTP_X_LANGSMITH_USER_TOKEN"], env["HTTP_HOST"]
	if token == "" || host == "" {
		t.Fatalf("no token or host in:\n%s", body)
	}

	t.Run("official verifier", func(t *testing.T) {
		out := runNodeScript(t, "verify-user-token.mjs", "LANGSMITH_ENDPOINT="+f.d.Endpoint, "USER_TOKEN="+token, "FORGED_TOKEN="+forge(t, token), "AUDIENCE="+host)
		if want := "real: OK sub=" + uma.ID + " email=uma@example.com name=Uma"; !strings.Contains(out, want) {
			t.Errorf("the official verifier did not accept the gateway's token (want %q)", want)
		}
		if !strings.Contains(out, "forged: REJECTED invalid signature") {
			t.Errorf("the official verifier did not reject a forged token")
		}
	})
}

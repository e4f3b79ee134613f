package proxy

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/awssts/ststest"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys/jwtkeystest"
)

// fakeSecrets holds workspace secrets by "workspace/name".
type fakeSecrets map[string]string

func (f fakeSecrets) Secret(_ context.Context, ws, name string) ([]byte, error) {
	if v, ok := f[ws+"/"+name]; ok {
		return []byte(v), nil
	}
	return nil, fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
}

func (f fakeSecrets) MayUse(context.Context, auth.Principal, string) error { return nil }

// credTest is a Service and sandbox whose upstream transport trusts ts.
func credTest(t *testing.T, ts *httptest.Server, secrets fakeSecrets, cfg Config) (*Service, *sandbox) {
	cfg.Secrets = secrets
	s := &Service{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	return s, &sandbox{id: "sb-1", workspace: "ws-1", transport: ts.Client().Transport.(*http.Transport)}
}

func mustParse(t *testing.T, cfg string) *Policy {
	p, err := Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sandboxRequest(method, u string) *http.Request {
	r := httptest.NewRequest(method, u, strings.NewReader(`{"q":1}`))
	r.Header.Set("X-Trace", "t1")
	return r
}

// TestAssumeRole: a role_arn rule signs with STS's temporary credentials,
// obtained with the workspace's base keys, and STS is asked once while
// they are valid.
func TestAssumeRole(t *testing.T) {
	sts := ststest.StartTLS(t, aws.Credentials{AccessKeyID: "BASEAK", SecretAccessKey: "basesecret"},
		aws.Credentials{AccessKeyID: "ASIATEMP", SecretAccessKey: "tempsecret", SessionToken: "sess-tok"}, time.Hour)
	s, sb := credTest(t, sts.Server, fakeSecrets{"ws-1/AWS_ACCESS_KEY_ID": "BASEAK", "ws-1/AWS_SECRET_ACCESS_KEY": "basesecret"}, Config{STSEndpoint: sts.URL})
	pol := mustParse(t, `{"rules":[{"name":"role","type":"aws","aws":{"role_arn":"arn:aws:iam::123456789012:role/app","session_tags":{"team":"blue"}}}]}`)
	for range 2 {
		_, signer, applied, err := s.credentials(sandboxRequest("GET", "https://sqs.us-west-2.amazonaws.com/"), sb, pol, "sqs.us-west-2.amazonaws.com", 443)
		if err != nil {
			t.Fatal(err)
		}
		if signer == nil || signer.creds.AccessKeyID != "ASIATEMP" || signer.creds.SessionToken != "sess-tok" || signer.region != "us-west-2" || len(applied) != 1 {
			t.Fatalf("signer %+v applied %v", signer, applied)
		}
	}
	calls := sts.Calls()
	if len(calls) != 1 {
		t.Fatalf("STS called %d times, want 1 (cached)", len(calls))
	}
	if f := calls[0]; f.Get("RoleArn") != "arn:aws:iam::123456789012:role/app" || f.Get("ExternalId") != "ws-1" ||
		f.Get("RoleSessionName") != "cubicle-sb-1" || f.Get("Tags.member.1.Key") != "team" || f.Get("Tags.member.1.Value") != "blue" {
		t.Fatalf("AssumeRole form = %v", f)
	}
	// Without base credentials the rule fails and names them.
	s2, sb2 := credTest(t, sts.Server, fakeSecrets{}, Config{STSEndpoint: sts.URL})
	if _, _, _, err := s2.credentials(sandboxRequest("GET", "https://sqs.us-west-2.amazonaws.com/"), sb2, pol, "sqs.us-west-2.amazonaws.com", 443); err == nil || !strings.Contains(err.Error(), "base credentials") {
		t.Fatalf("no base credentials: %v", err)
	}
}

// TestGCPToken: a gcp rule injects a bearer token minted at the key's own
// token_uri with a JWT assertion signed by the key, cached until expiry.
func TestGCPToken(t *testing.T) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	der, _ := x509.MarshalPKCS8PrivateKey(rk)
	var calls atomic.Int32
	var tokenURI string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		r.ParseForm()
		parts := strings.Split(r.PostForm.Get("assertion"), ".")
		if r.URL.Path != "/token" || len(parts) != 3 {
			http.Error(w, "no assertion", http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
		sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
		if rsa.VerifyPKCS1v15(&rk.PublicKey, crypto.SHA256, sum[:], sig) != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
		var c struct{ Iss, Scope, Aud string }
		json.Unmarshal(raw, &c)
		if c.Iss != "sa@proj.iam.gserviceaccount.com" || c.Scope != "https://www.googleapis.com/auth/devstorage.read_only" || c.Aud != tokenURI {
			http.Error(w, "bad claims "+string(raw), http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"access_token":"ya29.minted","expires_in":3600,"token_type":"Bearer"}`)
	}))
	defer srv.Close()
	tokenURI = srv.URL + "/token"
	key, _ := json.Marshal(map[string]string{"type": "service_account", "client_email": "sa@proj.iam.gserviceaccount.com", "private_key_id": "k1",
		"private_key": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})), "token_uri": tokenURI})
	s, sb := credTest(t, srv, fakeSecrets{"ws-1/GCP_KEY": string(key)}, Config{})
	pol := mustParse(t, `{"rules":[{"name":"gcs","type":"gcp","gcp":{"service_account_json":{"type":"workspace_secret","value":"{GCP_KEY}"},"scopes":["https://www.googleapis.com/auth/devstorage.read_only"]}}]}`)
	if !pol.Intercepts("storage.googleapis.com") || pol.Intercepts("example.com") {
		t.Fatal("gcp rule does not default to Google API hosts")
	}
	for range 2 {
		h, _, _, err := s.credentials(sandboxRequest("GET", "https://storage.googleapis.com/b"), sb, pol, "storage.googleapis.com", 443)
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Get("Authorization"); got != "Bearer ya29.minted" {
			t.Fatalf("Authorization %q", got)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("token endpoint called %d times, want 1", n)
	}
	if _, err := Parse([]byte(`{"rules":[{"name":"g","type":"gcp","gcp":{"service_account_json":{"type":"opaque","value":"{}"}}}]}`)); err == nil {
		t.Error("an opaque value that is no key file was accepted")
	}
}

// TestCallback: a callback gets a signed description of the request and
// its answered headers are injected, cached for ttl_seconds; no_proxy
// hosts are not intercepted at all.
func TestCallback(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	ids, _ := jwtkeys.New(priv, "https://cubicle.example")
	var calls atomic.Int32
	var cbURL string
	var seen callbackBody
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		claims, err := jwtkeystest.Verify(ids.JWKS(), r.Header.Get(CallbackSignatureHeader), cbURL)
		sum := sha256.Sum256(body)
		if err != nil || claims["sub"] != CallbackSubject || claims["body_sha256"] != hex.EncodeToString(sum[:]) {
			http.Error(w, fmt.Sprintf("bad signature %v %v", err, claims), http.StatusUnauthorized)
			return
		}
		json.Unmarshal(body, &seen)
		io.WriteString(w, `{"headers":{"Authorization":"Bearer from-callback","X-Tenant":"`+seen.Identity.TenantID+`"}}`)
	}))
	defer srv.Close()
	cbURL = srv.URL + "/cb?x=1"
	s, sb := credTest(t, srv, fakeSecrets{}, Config{Identity: ids})
	pol := mustParse(t, `{"callbacks":[{"url":"`+cbURL+`","match_hosts":["*.api.example"],"ttl_seconds":60,"full_request":true}],"no_proxy":["raw.api.example"]}`)
	if !pol.Proxied() || !pol.Intercepts("v1.api.example") || pol.Intercepts("raw.api.example") || len(pol.CallbacksFor("raw.api.example")) != 0 {
		t.Fatal("callback hosts / no_proxy not honoured")
	}
	for range 2 {
		r := sandboxRequest("POST", "https://v1.api.example/p?q=2")
		h, _, applied, err := s.credentials(r, sb, pol, "v1.api.example", 443)
		if err != nil {
			t.Fatal(err)
		}
		if h.Get("Authorization") != "Bearer from-callback" || h.Get("X-Tenant") != "ws-1" || len(applied) != 1 {
			t.Fatalf("injected %v (%v)", h, applied)
		}
		if rest, _ := io.ReadAll(r.Body); string(rest) != `{"q":1}` {
			t.Fatalf("request body after the callback read it: %q", rest)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("callback called %d times, want 1 (ttl)", n)
	}
	rq := seen.Request
	if seen.Host != "v1.api.example" || seen.Port != 443 || seen.Identity.SandboxID != "sb-1" || rq == nil || rq.Method != "POST" ||
		rq.Path != "/p" || rq.Query != "q=2" || rq.Headers["X-Trace"][0] != "t1" || rq.BodyBase64 != base64.StdEncoding.EncodeToString([]byte(`{"q":1}`)) {
		t.Errorf("callback body %+v %+v", seen, rq)
	}
	for _, bad := range []string{
		`{"callbacks":[{"url":"http://cb.example","match_hosts":["a.com"]}]}`,
		`{"callbacks":[{"url":"https://cb.example"}]}`,
		`{"callbacks":[{"url":"https://cb.example","match_hosts":["a.com"],"ttl_seconds":-1}]}`,
		`{"no_proxy":["bad host!"]}`,
		`{"rules":[{"name":"r","match_hosts":["a.com"],"env_vars":{"1BAD":"x"}}]}`,
	} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

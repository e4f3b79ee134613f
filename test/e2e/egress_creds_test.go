package e2e

import (
	"crypto"
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
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys/jwtkeystest"
)

// Fake endpoints of the credential tests, all in the test internet.
const (
	stsHost      = "sts.e2e.test"
	tokenHost    = "oauth2.e2e.test"
	callbackHost = "callback.e2e.test"
	cbAPIHost    = "api.e2e.test"
	gcsHost      = "storage.googleapis.com"
	sqsHost      = "sqs.us-west-2.amazonaws.com"
	callbackURL  = "https://" + callbackHost + "/sandbox-callback"
)

// Credentials of the test: the workspace's, and what the fakes mint.
const (
	baseAK, baseSK = "AKIAE2EBASE0000000001", "e2eBaseSecret5b1f0c8d9a2e4b6f8c0d2e4f6a8b0c2d"
	tempAK, tempSK = "ASIAE2ETEMP000000001", "e2eTempSecret0c2d4e6f8a0b2c4d6e8f0a2b4c6d8e0f"
	sessTok        = "e2eSessionTokenQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ"
	gcpTok         = "ya29.e2eMintedgggggggggggggggggggggggggggggg"
	cbTok          = "cbMintedcccccccccccccccccccccccccccccc"
)

// credFakes plays STS, a Google token endpoint and a callback endpoint,
// and counts the calls each gets.
type credFakes struct {
	rk                             *rsa.PrivateKey
	jwks                           jwtkeys.JWKS
	sts, token, callback           atomic.Int32
	mu                             sync.Mutex
	sandboxID, cbBody, cbSignature string
}

// saKey is the service-account key file of fk's Google fake, and one line
// of its PEM private key (to search the sandbox for).
func (fk *credFakes) saKey() (key []byte, pemLine string) {
	der, _ := x509.MarshalPKCS8PrivateKey(fk.rk)
	p := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	key, _ = json.Marshal(map[string]string{"type": "service_account", "client_email": "e2e@proj.iam.gserviceaccount.com", "private_key_id": "k1",
		"private_key": p, "token_uri": "https://" + tokenHost + "/token"})
	return key, strings.Split(p, "\n")[3]
}

// route installs the fakes and the APIs they guard in e's internet.
func (fk *credFakes) route(e *egressEnv) {
	stsVerifier := &sigv4Server{creds: aws.Credentials{AccessKeyID: baseAK, SecretAccessKey: baseSK}, scopes: map[string][2]string{stsHost: {"sts", "us-east-1"}}}
	e.in.route(stsHost, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fk.serveSTS(w, r, stsVerifier) }))
	e.in.route(sqsHost, &sigv4Server{creds: aws.Credentials{AccessKeyID: tempAK, SecretAccessKey: tempSK, SessionToken: sessTok}, scopes: map[string][2]string{sqsHost: {"sqs", "us-west-2"}}})
	e.in.route(tokenHost, http.HandlerFunc(fk.serveToken))
	e.in.route(gcsHost, bearerAPI("gcp", gcpTok))
	e.in.route(callbackHost, http.HandlerFunc(fk.serveCallback))
	e.in.route(cbAPIHost, bearerAPI("callback", cbTok))
}

// serveSTS answers AssumeRole signed with the base keys with temporary ones.
func (fk *credFakes) serveSTS(w http.ResponseWriter, r *http.Request, v *sigv4Server) {
	fk.sts.Add(1)
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	if err := v.verify(r); err != nil {
		http.Error(w, "<ErrorResponse><Error><Code>SignatureDoesNotMatch</Code><Message>"+err.Error()+"</Message></Error></ErrorResponse>", http.StatusForbidden)
		return
	}
	if !strings.Contains(string(body), "RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fe2e") || !strings.Contains(string(body), "Tags.member.1.Value=blue") {
		http.Error(w, "bad form "+string(body), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, `<AssumeRoleResponse><AssumeRoleResult><Credentials><AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey><SessionToken>%s</SessionToken><Expiration>%s</Expiration></Credentials></AssumeRoleResult></AssumeRoleResponse>`,
		tempAK, tempSK, sessTok, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
}

// serveToken mints an access token for a JWT assertion signed by the key.
func (fk *credFakes) serveToken(w http.ResponseWriter, r *http.Request) {
	fk.token.Add(1)
	r.ParseForm()
	parts := strings.Split(r.PostForm.Get("assertion"), ".")
	if len(parts) != 3 {
		http.Error(w, "no assertion", http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	if rsa.VerifyPKCS1v15(&fk.rk.PublicKey, crypto.SHA256, sum[:], sig) != nil {
		http.Error(w, "bad assertion signature", http.StatusUnauthorized)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"access_token":%q,"expires_in":3600,"token_type":"Bearer"}`, gcpTok)
}

// serveCallback checks the signature against the daemon's JWKS and the
// body's identity, and answers the header to inject.
func (fk *credFakes) serveCallback(w http.ResponseWriter, r *http.Request) {
	fk.callback.Add(1)
	body, _ := io.ReadAll(r.Body)
	fk.mu.Lock()
	fk.cbBody, fk.cbSignature = string(body), r.Header.Get("X-LangSmith-Signature-JWT")
	want := fk.sandboxID
	fk.mu.Unlock()
	claims, err := jwtkeystest.Verify(fk.jwks, r.Header.Get("X-LangSmith-Signature-JWT"), callbackURL)
	sum := sha256.Sum256(body)
	if err != nil || claims["sub"] != "langsmith-sandbox-callback" || claims["body_sha256"] != hex.EncodeToString(sum[:]) {
		http.Error(w, fmt.Sprintf("bad signature: %v", err), http.StatusUnauthorized)
		return
	}
	var cb struct {
		Host     string `json:"host"`
		Identity struct {
			TenantID  string `json:"tenant_id"`
			SandboxID string `json:"sandbox_id"`
		} `json:"identity"`
	}
	if json.Unmarshal(body, &cb) != nil || cb.Host != cbAPIHost || cb.Identity.SandboxID != want || cb.Identity.TenantID != "default" {
		http.Error(w, "bad body "+string(body), http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, `{"headers":{"Authorization":"Bearer %s"}}`, cbTok)
}

// bearerAPI answers "<what> ok" to requests carrying Bearer tok, 401
// otherwise.
func bearerAPI(what, tok string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+tok {
			http.Error(w, what+": missing or wrong bearer token", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "%s ok\n", what)
	})
}

// fetchJWKS reads the daemon's public keys as a verifier would.
func fetchJWKS(t *testing.T, endpoint string) jwtkeys.JWKS {
	var set jwtkeys.JWKS
	resp, err := http.Get(endpoint + "/.well-known/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&set); resp.StatusCode != 200 || err != nil || len(set.Keys) != 1 {
		t.Fatalf("jwks: %d %v %+v", resp.StatusCode, err, set)
	}
	return set
}

// TestEgressCredentials: GCP service-account, AWS role_arn and callback
// rules get their credentials from fake Google, STS and callback endpoints
// and inject them on the wire; a rule's env_vars reach commands; no secret
// — the keys, nor anything minted from them — is ever inside the sandbox.
func TestEgressCredentials(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testEgressCredentials(t, rt) })
	}
}

func testEgressCredentials(t *testing.T, rt string) {
	rk, _ := rsa.GenerateKey(rand.Reader, 2048)
	fk := &credFakes{rk: rk}
	saKey, pemLine := fk.saKey()
	e := newEgressEnvArgs(t, rt, []string{"--egress-sts-endpoint", "https://" + stsHost}, stsHost, tokenHost, callbackHost, cbAPIHost, gcsHost, sqsHost)
	fk.jwks = fetchJWKS(t, e.d.Endpoint)
	fk.route(e)
	for name, v := range map[string]string{"AWS_ACCESS_KEY_ID": baseAK, "AWS_SECRET_ACCESS_KEY": baseSK, "GCP_SA_KEY": string(saKey)} {
		if code, b := e.api(t, "PUT", "/secrets/"+name, map[string]string{"value": v}); code != 200 {
			t.Fatalf("put secret %s: %d %s", name, code, b)
		}
	}
	pc := fmt.Sprintf(`{"rules":[
		{"name":"role","type":"aws","aws":{"role_arn":"arn:aws:iam::123456789012:role/e2e","session_tags":{"team":"blue"}},"env_vars":{"AWS_ACCESS_KEY_ID":"dummy","AWS_SECRET_ACCESS_KEY":"dummy"}},
		{"name":"marker","match_hosts":["secure.test","allowed.test"],"headers":[{"name":"X-Opaque","value":"np-marker"}]},
		{"name":"gcs","type":"gcp","gcp":{"service_account_json":{"type":"workspace_secret","value":"{GCP_SA_KEY}"},"scopes":["https://www.googleapis.com/auth/devstorage.read_only"]},"env_vars":{"GH_TOKEN":"dummy-gh"}}],
		"callbacks":[{"url":%q,"match_hosts":[%q],"ttl_seconds":300}],
		"no_proxy":["secure.test"]}`, callbackURL, cbAPIHost)
	sb := e.sandbox(t, "egress-creds", pc)
	fk.mu.Lock()
	fk.sandboxID = sb.ID
	fk.mu.Unlock()
	c := e.d.Client
	to := "egclient -to " + e.in.addr(1) + " "
	// Each flow twice: the second is served from the proxy's cache.
	for _, f := range []struct {
		name, cmd, want string
		calls           *atomic.Int32
	}{
		{"aws role", "-X POST -d 'Action=ListQueues' https://" + sqsHost + "/", "aws ok service=sqs region=us-west-2", &fk.sts},
		{"gcp", "https://" + gcsHost + "/storage/v1/b", "gcp ok", &fk.token},
		{"callback", "https://" + cbAPIHost + "/v1", "callback ok", &fk.callback},
	} {
		t.Run(f.name, func(t *testing.T) {
			for range 2 {
				allowed(t, c, sb.Name, to+f.cmd+" 2>&1", f.want)
			}
			if n := f.calls.Load(); n != 1 {
				t.Errorf("credential endpoint called %d times, want 1 (cached)", n)
			}
		})
	}
	t.Run("official callback verifier", func(t *testing.T) {
		fk.mu.Lock()
		body, sig := fk.cbBody, fk.cbSignature
		fk.mu.Unlock()
		out := runNodeScript(t, "verify-callback.mjs", "LANGSMITH_ENDPOINT="+e.d.Endpoint, "CALLBACK_URL="+callbackURL, "CALLBACK_BODY="+body, "CALLBACK_SIGNATURE="+sig)
		if want := fmt.Sprintf("real: OK host=%s port=443 sandbox=%s tenant=default", cbAPIHost, sb.ID); !strings.Contains(out, want) {
			t.Errorf("the official verifier did not accept the callback (want %q)", want)
		}
		if !strings.Contains(out, "tampered: REJECTED body does not match signature") {
			t.Errorf("the official verifier accepted a tampered callback body")
		}
	})
	t.Run("env vars", func(t *testing.T) {
		allowed(t, c, sb.Name, "echo gh=$GH_TOKEN aws=$AWS_ACCESS_KEY_ID", "gh=dummy-gh aws=dummy")
	})
	t.Run("no_proxy is not intercepted", func(t *testing.T) {
		// The marker rule matches both hosts; only the one outside
		// no_proxy is intercepted and gets its header.
		allowed(t, c, sb.Name, to+"https://allowed.test/ 2>&1", "tls hello: host=allowed.test")
		allowed(t, c, sb.Name, to+"-ca /tmp/inet-ca.pem https://secure.test/ 2>&1", "tls hello: host=secure.test")
		if got := strings.Join(e.in.receivedAuth(), ","); got != "|np-marker,|" {
			t.Errorf("X-Opaque the internet saw (allowed.test, secure.test): %q", got)
		}
	})
	t.Run("secrets stay outside", func(t *testing.T) {
		for _, s := range []string{baseSK, tempSK, sessTok, gcpTok, cbTok, pemLine} {
			out, _, _ := run(t, c, sb.Name, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c -F -e '"+s+"'; grep -rl -F -e '"+s+"' / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; true")
			if strings.TrimSpace(out) != "0" {
				t.Errorf("secret %.12s… found inside the sandbox: %q", s, out)
			}
		}
	})
}

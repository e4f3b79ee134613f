package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// sigv4Server plays AWS endpoints in the test internet: it answers 200
// only to requests whose SigV4 signature, recomputed from the request as
// received with the known secret key, matches the Authorization header;
// 403 otherwise.
type sigv4Server struct {
	creds aws.Credentials
	// scopes maps a host to the service and region its credential scope
	// must name.
	scopes map[string][2]string

	mu       sync.Mutex
	verified []string // "METHOD host path payload-hash" of verified requests
}

func (v *sigv4Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := v.verify(r); err != nil {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, "SignatureDoesNotMatch: %v\n", err)
		return
	}
	sc := v.scopes[r.Host]
	fmt.Fprintf(w, "aws ok service=%s region=%s\n", sc[0], sc[1])
}

func (v *sigv4Server) verify(r *http.Request) error {
	sc, ok := v.scopes[r.Host]
	if !ok {
		return fmt.Errorf("unknown host %s", r.Host)
	}
	service, region := sc[0], sc[1]
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return fmt.Errorf("no SigV4 Authorization (%q)", auth)
	}
	fields := map[string]string{}
	for _, f := range strings.Split(rest, ",") {
		k, val, _ := strings.Cut(strings.TrimSpace(f), "=")
		fields[k] = val
	}
	wantCred := fmt.Sprintf("%s/%s/%s/%s/aws4_request", v.creds.AccessKeyID, r.Header.Get("X-Amz-Date")[:min(8, len(r.Header.Get("X-Amz-Date")))], region, service)
	if fields["Credential"] != wantCred {
		return fmt.Errorf("credential %q, want %q", fields["Credential"], wantCred)
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil || time.Since(at).Abs() > 5*time.Minute {
		return fmt.Errorf("bad X-Amz-Date %q", r.Header.Get("X-Amz-Date"))
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	actual := hex.EncodeToString(sum[:])
	payload := r.Header.Get("X-Amz-Content-Sha256")
	switch {
	case payload == "":
		payload = actual // the service hashes the body itself
	case payload == "UNSIGNED-PAYLOAD":
		if service != "s3" {
			return fmt.Errorf("UNSIGNED-PAYLOAD for %s", service)
		}
	case payload != actual:
		return fmt.Errorf("x-amz-content-sha256 %s does not match the body (%s)", payload, actual)
	}
	// Rebuild the request from its signed headers only and sign it again.
	cp, err := http.NewRequest(r.Method, "https://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return err
	}
	cp.Host = r.Host
	cp.ContentLength = 0
	for _, h := range strings.Split(fields["SignedHeaders"], ";") {
		switch h {
		case "host":
		case "content-length":
			cp.ContentLength = r.ContentLength
		default:
			vals := r.Header.Values(h)
			if len(vals) == 0 {
				return fmt.Errorf("signed header %s missing", h)
			}
			cp.Header[http.CanonicalHeaderKey(h)] = vals
		}
	}
	if err := v4.NewSigner().SignHTTP(context.Background(), v.creds, cp, payload, service, region, at, func(o *v4.SignerOptions) {
		o.DisableURIPathEscaping = service == "s3"
	}); err != nil {
		return err
	}
	if got := cp.Header.Get("Authorization"); got != auth {
		return fmt.Errorf("signature mismatch")
	}
	v.mu.Lock()
	v.verified = append(v.verified, fmt.Sprintf("%s %s %s %s", r.Method, r.Host, r.URL.Path, payload))
	v.mu.Unlock()
	return nil
}

func (v *sigv4Server) log() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.verified...)
}

func TestEgressAWS(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testEgressAWS(t, rt) })
	}
}

func testEgressAWS(t *testing.T, rt string) {
	const (
		akid   = "AKIAE2ETEST7F3C9A51D"
		secret = "e2eAwsSecret7f3c9a51d2b84e06wJalrXUtnFEMIK7MDENG"
	)
	srv := &sigv4Server{
		creds: aws.Credentials{AccessKeyID: akid, SecretAccessKey: secret},
		scopes: map[string][2]string{
			"s3.us-west-2.amazonaws.com":            {"s3", "us-west-2"},
			"e2e-bucket.s3.us-west-2.amazonaws.com": {"s3", "us-west-2"},
			"sts.us-east-2.amazonaws.com":           {"sts", "us-east-2"},
		},
	}
	var names []string
	for n := range srv.scopes {
		names = append(names, n)
	}
	e := newEgressEnv(t, rt, names...)
	for _, n := range names {
		e.in.route(n, srv)
	}
	c := e.d.Client

	t.Run("verifier", func(t *testing.T) {
		// The fake endpoint refuses a request signed with another key and
		// accepts one signed with the right key (sent from the host,
		// not through the proxy).
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(e.in.caPEM)
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: pool},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, net.JoinHostPort(e.in.addr(0), "443"))
			},
		}}
		for key, want := range map[string]int{secret: 200, secret + "x": 403} {
			req, _ := http.NewRequest("GET", "https://s3.us-west-2.amazonaws.com/e2e-bucket/k?x=1", nil)
			req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
			err := v4.NewSigner().SignHTTP(context.Background(), aws.Credentials{AccessKeyID: akid, SecretAccessKey: key}, req, "UNSIGNED-PAYLOAD", "s3", "us-west-2", time.Now(), func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Fatalf("direct request signed with key %q: %d %s, want %d", key, resp.StatusCode, b, want)
			}
		}
	})

	if code, b := e.api(t, "PUT", "/secrets/AWS_E2E_SECRET", map[string]string{"value": secret}); code != 200 {
		t.Fatalf("put secret: %d %s", code, b)
	}
	pc := fmt.Sprintf(`{"rules":[{"name":"aws","type":"aws","enabled":true,"aws":{
		"access_key_id":{"type":"plaintext","value":%q},
		"secret_access_key":{"type":"workspace_secret","value":"{AWS_E2E_SECRET}"}}}]}`, akid)
	sb := e.sandbox(t, "egress-aws", pc)
	to := "egclient -to " + e.in.addr(1) + " "

	t.Run("unsigned requests are signed", func(t *testing.T) {
		allowed(t, c, sb.Name, to+"'https://s3.us-west-2.amazonaws.com/e2e-bucket/some%20key?list-type=2&prefix=a/b' 2>&1", "aws ok service=s3 region=us-west-2")
		allowed(t, c, sb.Name, to+"-X PUT -d hello-object https://e2e-bucket.s3.us-west-2.amazonaws.com/dir/obj.txt 2>&1", "aws ok service=s3 region=us-west-2")
		// A non-S3 service: the body is hashed into the signature.
		allowed(t, c, sb.Name, to+"-X POST -H 'Content-Type: application/x-www-form-urlencoded' -d 'Action=GetCallerIdentity&Version=2011-06-15' https://sts.us-east-2.amazonaws.com/ 2>&1", "aws ok service=sts region=us-east-2")
	})
	t.Run("a bogus signature is replaced", func(t *testing.T) {
		bogus := "-H 'Authorization: AWS4-HMAC-SHA256 Credential=AKIDUMMY/20200101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-date, Signature=deadbeef' " +
			"-H 'X-Amz-Date: 20200101T000000Z' -H 'X-Amz-Security-Token: bogus' -H 'X-Amz-Content-Sha256: UNSIGNED-PAYLOAD' "
		allowed(t, c, sb.Name, to+bogus+"https://s3.us-west-2.amazonaws.com/e2e-bucket/k 2>&1", "aws ok")
		allowed(t, c, sb.Name, to+bogus+"-X POST -d 'Action=GetCallerIdentity&Version=2011-06-15' https://sts.us-east-2.amazonaws.com/ 2>&1", "aws ok service=sts")
	})
	t.Run("server saw verified requests", func(t *testing.T) {
		got := strings.Join(srv.log(), "\n")
		for _, want := range []string{
			"GET s3.us-west-2.amazonaws.com /e2e-bucket/some key UNSIGNED-PAYLOAD",
			"PUT e2e-bucket.s3.us-west-2.amazonaws.com /dir/obj.txt UNSIGNED-PAYLOAD",
			"POST sts.us-east-2.amazonaws.com / ",
		} {
			if !strings.Contains(got, want) {
				t.Fatalf("verified requests:\n%s\nwant %q", got, want)
			}
		}
		if strings.Contains(got, "POST sts.us-east-2.amazonaws.com / UNSIGNED-PAYLOAD") {
			t.Fatalf("STS body not hashed:\n%s", got)
		}
	})
	t.Run("secret stays outside", func(t *testing.T) {
		out, _, _ := run(t, c, sb.Name, "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c "+secret+"; grep -rl "+secret+" / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; true")
		if strings.TrimSpace(out) != "0" {
			t.Fatalf("secret found inside the sandbox: %q", out)
		}
		code, b := e.api(t, "GET", "/boxes/"+sb.Name+"/egress-log", nil)
		if code != 200 || strings.Contains(string(b), secret) || !strings.Contains(string(b), `"aws"`) {
			t.Fatalf("egress-log: %d %s", code, b)
		}
	})
	t.Run("plain HTTP is not signed", func(t *testing.T) {
		// No credentials over cleartext: the request goes out as sent.
		out, _, _ := timed(t, c, sb.Name, get("http://"+e.in.addr(1)+"/", "s3.us-west-2.amazonaws.com"))
		if !strings.Contains(out, "hello from the internet") {
			t.Fatalf("plain HTTP: %q", out)
		}
	})
	t.Run("bad role_arn and gcp rules are refused", func(t *testing.T) {
		for _, bad := range []string{
			`{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::1:role/x"}}]}`,
			`{"rules":[{"name":"r","type":"aws","aws":{"role_arn":"arn:aws:iam::123456789012:role/x","access_key_id":"AK"}}]}`,
			`{"rules":[{"name":"g","type":"gcp","gcp":{"service_account_json":{"type":"plaintext","value":"{}"},"scopes":["s"]}}]}`,
		} {
			code, b := e.api(t, "PATCH", "/boxes/"+sb.Name, map[string]json.RawMessage{"proxy_config": json.RawMessage(bad)})
			if code != 422 {
				t.Fatalf("PATCH %s: %d %s, want 422", bad, code, b)
			}
		}
		// The AWS rule still applies.
		allowed(t, c, sb.Name, to+"https://s3.us-west-2.amazonaws.com/e2e-bucket/k 2>&1", "aws ok")
	})
}

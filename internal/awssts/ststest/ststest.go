// Package ststest is a test double of AWS STS: a real HTTP server that
// speaks AssumeRole's query protocol and XML, checks the caller's SigV4
// signature against the base credentials it was given, and hands out the
// temporary credentials it was told to.
package ststest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// STS answers AssumeRole, signed with Base, with Temp valid for TTL from
// the call. URL is its endpoint, Server its test server (for its client).
type STS struct {
	URL    string
	Server *httptest.Server
	Base   aws.Credentials
	Temp   aws.Credentials
	TTL    time.Duration

	mu    sync.Mutex
	calls []url.Values
}

// Start serves a fake STS over HTTP on loopback until the test ends.
func Start(t testing.TB, base, temp aws.Credentials, ttl time.Duration) *STS {
	return start(t, base, temp, ttl, false)
}

// StartTLS is Start over HTTPS (trusted by f.Server.Client()).
func StartTLS(t testing.TB, base, temp aws.Credentials, ttl time.Duration) *STS {
	return start(t, base, temp, ttl, true)
}

func start(t testing.TB, base, temp aws.Credentials, ttl time.Duration, tls bool) *STS {
	f := &STS{Base: base, Temp: temp, TTL: ttl}
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	if tls {
		f.Server.StartTLS()
	} else {
		f.Server.Start()
	}
	t.Cleanup(f.Server.Close)
	f.URL = f.Server.URL
	return f
}

// Calls returns the forms of the AssumeRole calls that were granted.
func (f *STS) Calls() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]url.Values(nil), f.calls...)
}

func (f *STS) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	if code, msg := f.verify(r, body); code != "" {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `<ErrorResponse><Error><Type>Sender</Type><Code>%s</Code><Message>%s</Message></Error></ErrorResponse>`, code, msg)
		return
	}
	form, err := url.ParseQuery(string(body))
	if err != nil || form.Get("Action") != "AssumeRole" || form.Get("RoleArn") == "" || form.Get("RoleSessionName") == "" {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `<ErrorResponse><Error><Code>InvalidParameterValue</Code><Message>not an AssumeRole call</Message></Error></ErrorResponse>`)
		return
	}
	f.mu.Lock()
	f.calls = append(f.calls, form)
	f.mu.Unlock()
	exp := time.Now().Add(f.TTL).UTC().Format(time.RFC3339)
	fmt.Fprintf(w, `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials>`+
		`<AccessKeyId>%s</AccessKeyId><SecretAccessKey>%s</SecretAccessKey><SessionToken>%s</SessionToken><Expiration>%s</Expiration>`+
		`</Credentials><AssumedRoleUser><Arn>%s/%s</Arn></AssumedRoleUser></AssumeRoleResult></AssumeRoleResponse>`,
		f.Temp.AccessKeyID, f.Temp.SecretAccessKey, f.Temp.SessionToken, exp, form.Get("RoleArn"), form.Get("RoleSessionName"))
}

// verify answers an error code and message as STS would, or "" if r is
// signed with Base.
func (f *STS) verify(r *http.Request, body []byte) (code, msg string) {
	sum := sha256.Sum256(body)
	switch err := CheckSignature(r, f.Base, "sts", hex.EncodeToString(sum[:])); {
	case errors.Is(err, ErrUnknownKey):
		return "InvalidClientTokenId", "the security token included in the request is invalid"
	case err != nil:
		return "SignatureDoesNotMatch", "the request signature we calculated does not match the signature you provided"
	}
	return "", ""
}

// ErrUnknownKey is CheckSignature's answer to a request signed with
// another access key.
var ErrUnknownKey = errors.New("signed with another access key")

// CheckSignature verifies r's SigV4 Authorization against creds (with
// their session token, if any) for service: it signs a copy of r's signed
// headers at r's X-Amz-Date and compares. payloadHash is the body's hex
// SHA-256, or for S3 the X-Amz-Content-Sha256 the request states.
func CheckSignature(r *http.Request, creds aws.Credentials, service, payloadHash string) error {
	authz := r.Header.Get("Authorization")
	fields := map[string]string{}
	for _, f := range strings.Split(strings.TrimPrefix(authz, "AWS4-HMAC-SHA256 "), ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
		fields[k] = v
	}
	scope := strings.Split(fields["Credential"], "/")
	if len(scope) != 5 || scope[3] != service || fields["SignedHeaders"] == "" {
		return fmt.Errorf("not signed for %s", service)
	}
	if scope[0] != creds.AccessKeyID {
		return ErrUnknownKey
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return errors.New("no X-Amz-Date")
	}
	cp, err := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), nil)
	if err != nil {
		return err
	}
	cp.ContentLength = r.ContentLength
	for _, h := range strings.Split(fields["SignedHeaders"], ";") {
		if h != "host" && h != "content-length" {
			cp.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	err = v4.NewSigner().SignHTTP(context.Background(), creds, cp, payloadHash, service, scope[2], at, func(o *v4.SignerOptions) {
		o.DisableURIPathEscaping = service == "s3"
	})
	if err != nil {
		return err
	}
	if cp.Header.Get("Authorization") != authz {
		return errors.New("signature does not match")
	}
	return nil
}

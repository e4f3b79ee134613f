package mountstest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/cubicle-dev/cubicle/internal/awssts/ststest"
)

// SessionFront returns an S3 endpoint in front of s that stands for S3
// under temporary credentials: it accepts only requests signed with temp
// (its key, secret and session token) and forwards them to versitygw
// re-signed with s's own keys. (versitygw honours session tokens only
// from its own IAM service.) Refused requests get S3's InvalidToken.
func (s *S3) SessionFront(t testing.TB, temp aws.Credentials) string {
	t.Helper()
	upstream, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	root := aws.Credentials{AccessKeyID: s.AccessKey, SecretAccessKey: s.SecretKey}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(upstream)
		pr.Out.Host = upstream.Host
		pr.Out.Header.Del("Authorization")
		pr.Out.Header.Del("X-Amz-Security-Token")
		_ = v4.NewSigner().SignHTTP(context.Background(), root, pr.Out, pr.In.Header.Get("X-Amz-Content-Sha256"), "s3", "us-east-1", time.Now(),
			func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := ststest.CheckSignature(r, temp, "s3", r.Header.Get("X-Amz-Content-Sha256")); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidToken</Code><Message>not signed with the session's credentials: %s</Message></Error>`, err)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

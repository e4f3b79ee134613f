package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"

	"github.com/cubicle-dev/cubicle/internal/awssts"
)

// AWS rules (spec §4.4, type "aws"): for requests to the rule's hosts the
// proxy terminates TLS, drops whatever signature the sandbox sent and signs
// the request with SigV4 using the rule's keys, which never enter the
// sandbox. The sandbox can therefore run an AWS SDK with dummy credentials.

// DefaultAWSHosts are the hosts an AWS rule without match_hosts applies to.
var DefaultAWSHosts = []string{"*.amazonaws.com", "*.amazonaws.com.cn"}

// MaxSignedBody is the largest request body the proxy buffers to hash for
// the signature. Larger (or S3) bodies are streamed with UNSIGNED-PAYLOAD.
const MaxSignedBody = 10 << 20

// emptySHA256 is the hex SHA-256 of an empty payload.
const emptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// AWSCredentials are an AWS rule's keys; each is a Header value (plaintext,
// opaque, or the name of a workspace secret) resolved per request. With
// RoleARN set there are no keys: the proxy assumes the role through STS
// with the workspace's base credentials (the workspace secrets
// awssts.BaseAccessKeySecret and BaseSecretKeySecret) and signs with the
// temporary ones. Region and Service, when set, override what is derived
// from the host.
type AWSCredentials struct {
	AccessKeyID     Header
	SecretAccessKey Header
	RoleARN         string
	SessionTags     map[string]string
	Region, Service string
}

type wireAWS struct {
	RoleARN         string            `json:"role_arn"`
	SessionTags     map[string]string `json:"session_tags"`
	AccessKeyID     json.RawMessage   `json:"access_key_id"`
	SecretAccessKey json.RawMessage   `json:"secret_access_key"`
	// Extensions: for match_hosts whose names do not follow AWS's scheme.
	Region  string `json:"region"`
	Service string `json:"service"`
}

func parseAWS(w *wireAWS) (*AWSCredentials, error) {
	if w == nil {
		return nil, fmt.Errorf("aws: give access_key_id and secret_access_key, or role_arn")
	}
	if w.Region != "" && !regionRE.MatchString(w.Region) {
		return nil, fmt.Errorf("aws.region: %q is not an AWS region", w.Region)
	}
	if w.RoleARN != "" {
		if len(w.AccessKeyID) != 0 || len(w.SecretAccessKey) != 0 {
			return nil, fmt.Errorf("aws: role_arn excludes access_key_id and secret_access_key")
		}
		if err := awssts.CheckARN(w.RoleARN); err != nil {
			return nil, fmt.Errorf("aws.role_arn: %v", err)
		}
		if err := awssts.CheckTags(w.SessionTags); err != nil {
			return nil, fmt.Errorf("aws.session_tags: %v", err)
		}
		return &AWSCredentials{RoleARN: w.RoleARN, SessionTags: w.SessionTags, Region: w.Region, Service: w.Service}, nil
	}
	if len(w.SessionTags) > 0 {
		return nil, fmt.Errorf("aws.session_tags: only with role_arn")
	}
	if len(w.AccessKeyID) == 0 || len(w.SecretAccessKey) == 0 {
		return nil, fmt.Errorf("aws: access_key_id and secret_access_key are required")
	}
	ak, err := parseSecret(w.AccessKeyID, "")
	if err != nil {
		return nil, fmt.Errorf("aws.access_key_id: %v", err)
	}
	sk, err := parseSecret(w.SecretAccessKey, "")
	if err != nil {
		return nil, fmt.Errorf("aws.secret_access_key: %v", err)
	}
	if ak.Value == "" || sk.Value == "" {
		return nil, fmt.Errorf("aws: access_key_id and secret_access_key must not be empty")
	}
	return &AWSCredentials{AccessKeyID: ak, SecretAccessKey: sk, Region: w.Region, Service: w.Service}, nil
}

// regionRE matches AWS region names (us-east-1, us-gov-west-1, ap-southeast-2,
// us-isob-east-1, ...), strictly enough not to take bucket names for one.
var regionRE = regexp.MustCompile(`^(us|eu|ap|sa|ca|me|af|il|mx|cn)(-gov|-iso[a-z]?)?-(east|west|north|south|central|northeast|southeast|northwest|southwest)-[0-9]+$`)

// signingNames maps endpoint prefixes to the SigV4 service name where they
// differ.
var signingNames = map[string]string{
	"email":                 "ses",
	"bedrock-runtime":       "bedrock",
	"bedrock-agent":         "bedrock",
	"bedrock-agent-runtime": "bedrock",
	"s3-control":            "s3",
	"s3-accelerate":         "s3",
	"s3-external-1":         "s3",
	"runtime-v2-lex":        "lex",
}

// AWSEndpoint derives the SigV4 service and region from an AWS host name:
// <service>.<region>.amazonaws.com, <bucket>.s3.<region>.amazonaws.com,
// dualstack/fips/VPC-endpoint variants, legacy s3-<region>, and global
// endpoints (iam.amazonaws.com, s3.amazonaws.com → us-east-1; .com.cn →
// cn-north-1). ok is false for a host outside amazonaws.com(.cn) and for
// one that is no valid DNS name or names no service (an empty label, or a
// bare "-fips", would sign for service "").
func AWSEndpoint(host string) (service, region string, ok bool) {
	service, region, ok = awsEndpoint(host)
	if service == "" {
		return "", "", false
	}
	return service, region, ok
}

func awsEndpoint(host string) (service, region string, ok bool) {
	host = normHost(hostOnly(host))
	if !validName(host) {
		return "", "", false
	}
	var rest, global string
	switch {
	case strings.HasSuffix(host, ".amazonaws.com.cn"):
		rest, global = strings.TrimSuffix(host, ".amazonaws.com.cn"), "cn-north-1"
	case strings.HasSuffix(host, ".amazonaws.com"):
		rest, global = strings.TrimSuffix(host, ".amazonaws.com"), "us-east-1"
	default:
		return "", "", false
	}
	labels := strings.Split(rest, ".")
	skip := func(l string) bool { return l == "dualstack" || l == "fips" }
	// The rightmost region label with a service label before it.
	for i := len(labels) - 1; i >= 1; i-- {
		if !regionRE.MatchString(labels[i]) {
			continue
		}
		j := i - 1
		for j > 0 && skip(labels[j]) {
			j--
		}
		return signingName(labels[:j+1]), labels[i], true
	}
	// Global endpoint: the service is the last label (dualstack aside).
	for len(labels) > 1 && skip(labels[len(labels)-1]) {
		labels = labels[:len(labels)-1]
	}
	last := strings.TrimSuffix(labels[len(labels)-1], "-fips")
	if r, found := strings.CutPrefix(last, "s3-"); found && regionRE.MatchString(r) {
		return "s3", r, true // legacy s3-<region>.amazonaws.com
	}
	return signingName(labels), global, true
}

// signingName is the SigV4 service name for the endpoint whose labels end
// with the service's (earlier labels are buckets, API ids, "runtime", ...).
func signingName(labels []string) string {
	svc := strings.TrimSuffix(labels[len(labels)-1], "-fips")
	if len(labels) > 1 && svc == "iot" && strings.HasPrefix(labels[len(labels)-2], "data") {
		return "iotdata"
	}
	if n, ok := signingNames[svc]; ok {
		return n
	}
	if strings.HasPrefix(svc, "s3express-") {
		return "s3express"
	}
	return svc
}

// awsSigner is the request's SigV4 signing, applied by RoundTrip to the
// outbound request (after the reverse proxy's last header edits).
type awsSigner struct {
	base            http.RoundTripper
	creds           aws.Credentials
	service, region string
}

// strippedAWSHeaders are what a sandbox's own (dummy) signing left on a
// request; they are removed before signing.
var strippedAWSHeaders = []string{"Authorization", "X-Amz-Date", "X-Amz-Security-Token", "X-Amz-Content-Sha256"}

// unsignedHeaders are hop-by-hop headers an intermediary may rewrite: they
// are sent but left out of the signature.
var unsignedHeaders = []string{"Te", "Connection", "Upgrade", "Proxy-Connection", "Keep-Alive"}

// presigned reports whether the request carries its own query-string
// signature (a presigned URL): it is forwarded as is.
func presigned(r *http.Request) bool {
	q := r.URL.Query()
	return q.Has("X-Amz-Signature") || q.Has("X-Amz-Credential")
}

// signedStreaming reports whether the sandbox sent an S3 upload with signed
// chunks, whose chunk signatures chain from a seed signature the proxy
// replaces: such a request cannot be re-signed.
func signedStreaming(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("X-Amz-Content-Sha256"), "STREAMING-AWS4-")
}

func (a *awsSigner) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.Clone(req.Context())
	if err := signAWS(req.Context(), out, a.creds, a.service, a.region, time.Now()); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return a.base.RoundTrip(out)
}

// signAWS replaces r's signature with one by creds for service in region,
// signed at t. The body is hashed if it is small (buffered up to
// MaxSignedBody) and the service is not S3; otherwise it is streamed as
// UNSIGNED-PAYLOAD.
func signAWS(ctx context.Context, r *http.Request, creds aws.Credentials, service, region string, t time.Time) error {
	s3 := strings.HasPrefix(service, "s3")
	clientHash := r.Header.Get("X-Amz-Content-Sha256")
	for _, k := range strippedAWSHeaders {
		r.Header.Del(k)
	}
	payload, sendHash := "", s3
	switch {
	case s3 && clientHash == "STREAMING-UNSIGNED-PAYLOAD-TRAILER":
		// aws-chunked body with unsigned chunks (SDKs' default for S3
		// uploads over TLS): the chunks need no key, keep the mode.
		payload = clientHash
	case s3:
		payload = "UNSIGNED-PAYLOAD"
	case r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0:
		payload = emptySHA256
	default:
		body := r.Body
		buf, err := io.ReadAll(io.LimitReader(body, MaxSignedBody+1))
		if err != nil {
			return fmt.Errorf("read request body: %w", err)
		}
		if len(buf) <= MaxSignedBody {
			sum := sha256.Sum256(buf)
			payload = hex.EncodeToString(sum[:])
			body.Close()
			r.ContentLength = int64(len(buf))
			r.TransferEncoding = nil
			r.Body, r.GetBody = http.NoBody, nil
			if len(buf) > 0 {
				r.Body = io.NopCloser(bytes.NewReader(buf))
				r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
			}
		} else {
			payload, sendHash = "UNSIGNED-PAYLOAD", true
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(buf), body), body}
			r.GetBody = nil
		}
	}
	if sendHash {
		r.Header.Set("X-Amz-Content-Sha256", payload)
	}
	held := http.Header{}
	for _, k := range unsignedHeaders {
		if vs, ok := r.Header[k]; ok {
			held[k] = vs
			delete(r.Header, k)
		}
	}
	// A signer per request: a signer caches derived keys by access key id
	// alone, so a shared one would go on signing with a replaced secret.
	err := v4.NewSigner().SignHTTP(ctx, creds, r, payload, service, region, t, func(o *v4.SignerOptions) {
		// S3 paths are signed as sent (no second escaping).
		o.DisableURIPathEscaping = s3
	})
	for k, vs := range held {
		r.Header[k] = vs
	}
	if err != nil {
		return fmt.Errorf("sigv4: %w", err)
	}
	return nil
}

// awsSignerFor resolves rule's keys and the request's service and region.
func (s *Service) awsSignerFor(ctx context.Context, sb *sandbox, rule Rule, host string) (*awsSigner, error) {
	c := rule.AWS
	service, region, _ := AWSEndpoint(host)
	if c.Service != "" {
		service = c.Service
	}
	if c.Region != "" {
		region = c.Region
	}
	if service == "" || region == "" {
		return nil, fmt.Errorf("cannot derive the AWS service and region from host %s (not <service>.<region>.amazonaws.com; set aws.region and aws.service)", host)
	}
	var creds aws.Credentials
	if c.RoleARN != "" {
		var err error
		if creds, err = s.assumeRole(ctx, sb, c); err != nil {
			return nil, fmt.Errorf("assume %s: %w", c.RoleARN, err)
		}
	} else {
		ak, err := s.headerValue(ctx, sb, c.AccessKeyID)
		if err != nil {
			return nil, fmt.Errorf("access_key_id: %w", err)
		}
		sk, err := s.headerValue(ctx, sb, c.SecretAccessKey)
		if err != nil {
			return nil, fmt.Errorf("secret_access_key: %w", err)
		}
		creds = aws.Credentials{AccessKeyID: strings.TrimSpace(ak), SecretAccessKey: strings.TrimSpace(sk)}
	}
	creds.Source = "cubicle egress rule " + rule.Name
	return &awsSigner{base: sb.transport, creds: creds, service: service, region: region}, nil
}

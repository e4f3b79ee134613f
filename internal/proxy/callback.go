package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Proxy callbacks (proxy_config.callbacks[]): for a request to one of a
// callback's hosts the proxy POSTs a JSON description of it to the
// callback's URL and injects the headers the callback answers. Cubicle's
// shape, where the protocol is silent:
//
//	request body  {"host", "port", "identity": {"tenant_id", "sandbox_id"},
//	               "request"?: {"method", "url", "scheme", "host", "path",
//	               "query", "headers": {name: [values]}, "body_base64",
//	               "body_truncated"}}
//	answer        200 {"headers": {"Name": "value", ...}}
//
// "request" is sent when full_request is set (all headers and up to
// MaxCallbackBody bytes of the body) or request_headers names headers
// (just those, no body). The body is signed by an EdDSA JWT in
// X-LangSmith-Signature-JWT (sub "langsmith-sandbox-callback", aud the
// callback URL as configured, body_sha256 the hex SHA-256 of the body),
// verifiable with the daemon's /.well-known/jwks.json. Answers are cached
// per sandbox and request description for ttl_seconds (0: not cached).

// Callback is one parsed proxy callback.
type Callback struct {
	URL            string
	hosts          []hostPattern
	TTL            time.Duration
	FullRequest    bool
	RequestHeaders []string // canonical header names
}

// CallbackSignatureHeader carries a callback request's signature.
const CallbackSignatureHeader = "X-LangSmith-Signature-JWT"

// CallbackSubject is the sub of every callback signature.
const CallbackSubject = "langsmith-sandbox-callback"

// MaxCallbackBody is how much of a request body a full_request callback
// is sent.
const MaxCallbackBody = 64 << 10

// maxCallbackTTL bounds ttl_seconds.
const maxCallbackTTL = 24 * time.Hour

type wireCallback struct {
	URL            string   `json:"url"`
	MatchHosts     []string `json:"match_hosts"`
	TTLSeconds     int64    `json:"ttl_seconds"`
	FullRequest    bool     `json:"full_request"`
	RequestHeaders []string `json:"request_headers"`
}

func parseCallback(w wireCallback) (Callback, error) {
	u, err := url.Parse(w.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil {
		return Callback{}, fmt.Errorf("url: %q is not an https URL without credentials", w.URL)
	}
	if w.TTLSeconds < 0 || time.Duration(w.TTLSeconds)*time.Second > maxCallbackTTL {
		return Callback{}, fmt.Errorf("ttl_seconds: must be between 0 and %d", int64(maxCallbackTTL/time.Second))
	}
	cb := Callback{URL: w.URL, TTL: time.Duration(w.TTLSeconds) * time.Second, FullRequest: w.FullRequest}
	if len(w.MatchHosts) == 0 {
		return Callback{}, fmt.Errorf("match_hosts is required")
	}
	for _, h := range w.MatchHosts {
		hp, err := parseHost(h)
		if err != nil {
			return Callback{}, fmt.Errorf("match_hosts: %v", err)
		}
		cb.hosts = append(cb.hosts, hp)
	}
	for _, h := range w.RequestHeaders {
		if h == "" || strings.ContainsAny(h, " :\r\n\t") {
			return Callback{}, fmt.Errorf("request_headers: bad header name %q", h)
		}
		cb.RequestHeaders = append(cb.RequestHeaders, http.CanonicalHeaderKey(h))
	}
	return cb, nil
}

type callbackIdentity struct {
	TenantID  string `json:"tenant_id"`
	SandboxID string `json:"sandbox_id"`
}

type callbackRequest struct {
	Method        string              `json:"method"`
	URL           string              `json:"url"`
	Scheme        string              `json:"scheme"`
	Host          string              `json:"host"`
	Path          string              `json:"path"`
	Query         string              `json:"query,omitempty"`
	Headers       map[string][]string `json:"headers"`
	BodyBase64    string              `json:"body_base64"`
	BodyTruncated bool                `json:"body_truncated"`
}

type callbackBody struct {
	Host     string           `json:"host"`
	Port     uint16           `json:"port"`
	Identity callbackIdentity `json:"identity"`
	Request  *callbackRequest `json:"request,omitempty"`
}

// describe is the callback body for r (to host:port) from sb. A
// full_request callback reads up to MaxCallbackBody bytes of r's body and
// puts them back in front of the rest.
func describe(cb Callback, sb *sandbox, r *http.Request, host string, port uint16) ([]byte, error) {
	b := callbackBody{Host: host, Port: port, Identity: callbackIdentity{TenantID: sb.workspace, SandboxID: sb.id}}
	if cb.FullRequest || len(cb.RequestHeaders) > 0 {
		req := &callbackRequest{Method: r.Method, Scheme: "https", Host: host, Path: r.URL.Path, Query: r.URL.RawQuery, Headers: map[string][]string{}}
		req.URL = (&url.URL{Scheme: "https", Host: r.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}).String()
		if cb.FullRequest {
			for k, vs := range r.Header {
				req.Headers[k] = vs
			}
			if r.Body != nil && r.Body != http.NoBody {
				buf, err := io.ReadAll(io.LimitReader(r.Body, MaxCallbackBody+1))
				if err != nil {
					return nil, fmt.Errorf("read request body: %w", err)
				}
				req.BodyTruncated = len(buf) > MaxCallbackBody
				r.Body = struct {
					io.Reader
					io.Closer
				}{io.MultiReader(bytes.NewReader(buf), r.Body), r.Body}
				req.BodyBase64 = base64.StdEncoding.EncodeToString(buf[:min(len(buf), MaxCallbackBody)])
			}
		} else {
			for _, k := range cb.RequestHeaders {
				if vs := r.Header.Values(k); len(vs) > 0 {
					req.Headers[k] = vs
				}
			}
		}
		b.Request = req
	}
	return json.Marshal(b)
}

// callbackHeaders returns the headers cb answers for r, from the cache
// while its answer is fresh.
func (s *Service) callbackHeaders(ctx context.Context, sb *sandbox, cb Callback, r *http.Request, host string, port uint16) (http.Header, error) {
	if s.cfg.Identity == nil {
		return nil, fmt.Errorf("callbacks need the daemon's identity key, which is not configured")
	}
	body, err := describe(cb, sb, r, host, port)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	digest := hex.EncodeToString(sum[:])
	cacheKey := sb.id + "\x00" + cb.URL + "\x00" + digest
	now := time.Now()
	if h, ok := s.callbackAnswers.get(cacheKey, now); ok {
		return h, nil
	}
	sig, err := s.cfg.Identity.Sign(cb.URL, CallbackSubject, time.Minute, map[string]any{"body_sha256": digest})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cb.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("callback request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(CallbackSignatureHeader, sig)
	resp, err := (&http.Client{Transport: sb.transport, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("callback: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("callback %s answered %d", cb.URL, resp.StatusCode)
	}
	var ans struct {
		Headers map[string]string `json:"headers"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ans); err != nil {
		return nil, fmt.Errorf("callback %s: answer is not {\"headers\": {...}}: %v", cb.URL, err)
	}
	h := http.Header{}
	for k, v := range ans.Headers {
		if k == "" || strings.ContainsAny(k, " :\r\n\t") || strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("callback %s: bad header %q", cb.URL, k)
		}
		h.Set(k, v)
	}
	if cb.TTL > 0 {
		s.callbackAnswers.put(cacheKey, h, now.Add(cb.TTL), now)
	}
	return h, nil
}

package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"sync/atomic"
	"time"
)

// serveHTTP handles one request of a plain HTTP connection or of an
// intercepted TLS one (forward), reporting it to the meter: its span
// (continuing a traceparent the sandbox sent), status and bytes.
func (s *Service) serveHTTP(w http.ResponseWriter, r *http.Request) {
	m := metaFrom(r.Context())
	if m == nil {
		http.Error(w, "cubicle egress proxy: not a sandbox connection", http.StatusForbidden)
		return
	}
	host := normHost(hostOnly(r.Host))
	ctx, end := s.cfg.Meter.Request(r.Context(), r.Header, m.sb.id, r.Method, host)
	cw := &countingWriter{ResponseWriter: w, code: http.StatusOK}
	// The transport may still be reading the body when forward returns
	// (an upstream that answered early): count it atomically.
	var up atomic.Int64
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countingBody{ReadCloser: r.Body, n: &up}
	}
	start := time.Now()
	ev := s.forward(cw, r.WithContext(ctx), m, host)
	end(cw.code)
	s.cfg.Meter.EgressBytes(up.Load(), cw.n)
	s.recordRequest(ctx, m, r, ev, cw.code, up.Load(), cw.n, time.Since(start))
}

// forward enforces the policy on the request's Host (every request, not
// just the connection's first), injects rule headers (TLS only), re-signs
// AWS requests (TLS only) and forwards it over the sandbox's own
// transport. It returns the decision (zero when the request was refused
// before one: a misdirected request).
func (s *Service) forward(w http.ResponseWriter, r *http.Request, m *connMeta, host string) (ev Event) {
	sb := m.sb
	kind, scheme := "http", "http"
	if m.sni != "" {
		kind, scheme = "https", "https"
		if host != m.sni {
			// Requests inside a TLS connection must name the host the
			// connection was checked (and its certificate minted) for.
			http.Error(w, fmt.Sprintf("cubicle egress proxy: request for %s on a connection to %s", host, m.sni), http.StatusMisdirectedRequest)
			return
		}
	}
	pol := sb.policy.Load()
	target, v := decide(pol, host, m.od)
	ev = Event{Time: time.Now().UTC(), Kind: kind, Host: host, Dest: m.od.String(), Allowed: v.Allowed, Reason: v.Reason}
	if !v.Allowed {
		s.deny(sb, ev)
		denyResponse(w, host, v.Reason)
		return
	}
	var inject http.Header
	var signer *awsSigner
	if m.sni != "" {
		var rules []string
		var err error
		inject, signer, rules, err = s.credentials(r, sb, pol, host, m.od.Port())
		if err != nil {
			status := http.StatusBadGateway
			if errors.Is(err, errNotResignable) {
				status = http.StatusNotImplemented
			}
			s.log.Warn("egress credential injection failed", "sandbox", sb.id, "host", host, "err", err)
			http.Error(w, "cubicle egress proxy: "+err.Error(), status)
			return
		}
		ev.Rules = rules
	}
	sb.log.add(ev, m.sni != "")
	var transport http.RoundTripper = sb.transport
	if signer != nil {
		transport = signer
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = scheme
			pr.Out.URL.Host = joinHostPort(target, m.od.Port())
			pr.Out.Host = r.Host
			for k, vs := range inject {
				pr.Out.Header[k] = vs
			}
		},
		Transport:     transport,
		BufferPool:    relayBuffers,
		FlushInterval: 0, // ReverseProxy still flushes at once for event streams and unsized bodies
		ErrorLog:      nil,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			status := http.StatusBadGateway
			if errors.Is(err, ErrForbiddenAddr) || errors.Is(err, errDenied) {
				status = http.StatusForbidden
				ev.Allowed, ev.Reason = false, err.Error()
				s.deny(sb, Event{Time: time.Now().UTC(), Kind: kind, Host: host, Dest: m.od.String(), Reason: err.Error()})
			} else if !errors.Is(err, context.Canceled) {
				s.log.Info("egress upstream error", "sandbox", sb.id, "host", host, "err", err)
			}
			http.Error(w, "cubicle egress proxy: "+err.Error(), status)
		},
	}
	rp.ServeHTTP(w, r)
	return ev
}

// countingWriter records the status and counts the response body bytes
// relayed to the sandbox. Unwrap lets ReverseProxy's ResponseController
// reach the Flusher and Hijacker.
type countingWriter struct {
	http.ResponseWriter
	code int
	n    int64
}

func (c *countingWriter) WriteHeader(code int) {
	c.code = code
	c.ResponseWriter.WriteHeader(code)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// countingBody counts the request body bytes relayed upstream.
type countingBody struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// headerValue resolves a rule header's value. Secrets are read per request
// so a PUT of a workspace secret applies at once.
func (s *Service) headerValue(ctx context.Context, sb *sandbox, h Header) (string, error) {
	if h.Type != "workspace_secret" {
		return h.Value, nil
	}
	if s.cfg.Secrets == nil {
		return "", fmt.Errorf("workspace secrets are not configured")
	}
	v, err := s.cfg.Secrets.Secret(ctx, sb.workspace, h.Value)
	if err != nil {
		return "", fmt.Errorf("workspace secret %s: %w", h.Value, err)
	}
	return string(v), nil
}

// errNotResignable marks an AWS request the proxy cannot sign (501).
var errNotResignable = errors.New("cannot be re-signed")

// credentials resolves what the rules and callbacks matching an
// intercepted request to host:port add: headers to set, an AWS signer
// (the first AWS rule's), and the names of the rules applied. Errors name
// the rule and what failed, never a secret value.
func (s *Service) credentials(r *http.Request, sb *sandbox, pol *Policy, host string, port uint16) (http.Header, *awsSigner, []string, error) {
	ctx := r.Context()
	inject := http.Header{}
	var signer *awsSigner
	var applied []string
	for _, rule := range pol.RulesFor(host, r.URL.Path) {
		switch {
		case rule.AWS != nil:
			if signer != nil || presigned(r) {
				continue // the first AWS rule signs; presigned URLs go as they are
			}
			if signedStreaming(r) {
				return nil, nil, nil, fmt.Errorf("rule %q: S3 uploads with signed chunks (STREAMING-AWS4-*) %w; use unsigned payload chunks", rule.Name, errNotResignable)
			}
			var err error
			if signer, err = s.awsSignerFor(ctx, sb, rule, host); err != nil {
				return nil, nil, nil, fmt.Errorf("rule %q: %w", rule.Name, err)
			}
		case rule.GCP != nil:
			tok, err := s.gcpToken(ctx, sb, rule.GCP)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("rule %q: %w", rule.Name, err)
			}
			inject.Set("Authorization", "Bearer "+tok)
		default:
			for _, h := range rule.Headers {
				val, err := s.headerValue(ctx, sb, h)
				if err != nil {
					return nil, nil, nil, fmt.Errorf("rule %q: header %s: %w", rule.Name, h.Name, err)
				}
				inject.Set(h.Name, val)
			}
		}
		applied = append(applied, rule.Name)
	}
	for _, cb := range pol.CallbacksFor(host) {
		h, err := s.callbackHeaders(ctx, sb, cb, r, host, port)
		if err != nil {
			return nil, nil, nil, err
		}
		for k, vs := range h {
			inject[k] = vs
		}
		applied = append(applied, "callback "+cb.URL)
	}
	return inject, signer, applied, nil
}

// deny records a refused connection or request.
func (s *Service) deny(sb *sandbox, ev Event) {
	ev.Allowed = false
	sb.log.add(ev, false)
	s.log.Info("egress denied", "sandbox", sb.id, "kind", ev.Kind, "host", ev.Host, "dest", ev.Dest, "reason", ev.Reason)
}

func denyResponse(w http.ResponseWriter, host, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Cubicle-Egress", "denied")
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusForbidden)
	fmt.Fprintf(w, "cubicle egress proxy: request to %s blocked: %s (see the sandbox's proxy_config.access_control)\n", host, reason)
}

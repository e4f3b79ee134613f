package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Service URL token lifetimes (spec §9.1). Tokens are meant to be short-
// lived: the official client re-POSTs within 60 s of expiry on its own.
const (
	defaultServiceTTL = time.Hour
	maxServiceTTL     = 7 * 24 * time.Hour
)

// WriteError writes err as the protocol's error response. It is the error
// writer the service gateway is built with, so its errors map to HTTP in
// the same single place as every other handler's.
func WriteError(ctx context.Context, w http.ResponseWriter, err error) { writeError(ctx, w, err) }

// serviceURL exposes a port of a sandbox through the gateway (spec X3, §9):
// token mode ({port, expires_in_seconds?}) mints a signed token; login mode
// ({port, access}) grants API-key holders of the workspace access through a
// browser login. A token-mode request on a port with a login grant is 409.
func (s *Server) serviceURL(r *http.Request, req protocol.ServiceURLRequest) (protocol.ServiceURLResponse, error) {
	ttl, err := validateServiceURL(req)
	if err != nil {
		return protocol.ServiceURLResponse{}, err
	}
	embed, err := normalizeEmbedOrigins(req.EmbedOrigins)
	if err != nil {
		return protocol.ServiceURLResponse{}, err
	}
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		return protocol.ServiceURLResponse{}, err
	}
	if req.Access != "" {
		l := s.gw.GrantLogin(r.Context(), sb, req.Port, req.Access, embed)
		return protocol.ServiceURLResponse{ServiceURL: l.ServiceURL, BrowserURL: l.BrowserURL, Access: l.Access, EmbedOrigins: embed}, nil
	}
	l, err := s.gw.IssueService(r.Context(), sb, req.Port, ttl, embed)
	if err != nil {
		return protocol.ServiceURLResponse{}, err
	}
	return protocol.ServiceURLResponse{ServiceURL: l.ServiceURL, BrowserURL: l.BrowserURL,
		Token: l.Token, ExpiresAt: l.ExpiresAt.Format(time.RFC3339), EmbedURL: l.EmbedURL, EmbedOrigins: embed}, nil
}

// maxEmbedOrigins is how many origins one service URL may name.
const maxEmbedOrigins = 5

// normalizeEmbedOrigins checks embed_origins (each https://host[:port],
// http only for localhost; no path, query or credentials) and returns
// them as origins, without duplicates.
func normalizeEmbedOrigins(in []string) ([]string, error) {
	if len(in) > maxEmbedOrigins {
		return nil, errdefs.Field("embed_origins", "at most %d origins", maxEmbedOrigins)
	}
	var out []string
	for i, o := range in {
		u, err := url.Parse(strings.TrimRight(strings.TrimSpace(o), "/"))
		field := fmt.Sprintf("embed_origins[%d]", i)
		if err != nil || u.Host == "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.ContainsAny(u.Host, " ;,'\"") {
			return nil, errdefs.Field(field, "%q is not an origin (scheme://host[:port])", o)
		}
		local := u.Hostname() == "localhost" || u.Hostname() == "127.0.0.1" || u.Hostname() == "::1"
		if u.Scheme != "https" && !(u.Scheme == "http" && local) {
			return nil, errdefs.Field(field, "%q must be https (http only for localhost)", o)
		}
		origin := strings.ToLower(u.Scheme + "://" + u.Host)
		if !slices.Contains(out, origin) {
			out = append(out, origin)
		}
	}
	return out, nil
}

// validateServiceURL checks a service-url request and returns the token
// lifetime (token mode).
func validateServiceURL(req protocol.ServiceURLRequest) (time.Duration, error) {
	if req.Port < 1 || req.Port > 65535 {
		return 0, errdefs.Field("port", "must be between 1 and 65535")
	}
	if req.Port == agent.Port {
		return 0, errdefs.Field("port", "%d is reserved for the Cubicle agent", agent.Port)
	}
	switch req.Access {
	case "", protocol.AccessRestricted, protocol.AccessWorkspace:
	default:
		return 0, errdefs.Field("access", "must be %q or %q", protocol.AccessRestricted, protocol.AccessWorkspace)
	}
	if req.Access != "" && req.ExpiresInSeconds != nil {
		return 0, errdefs.Field("expires_in_seconds", "cannot be combined with access (login mode has no token)")
	}
	if req.ExpiresInSeconds == nil {
		return defaultServiceTTL, nil
	}
	ttl := time.Duration(*req.ExpiresInSeconds) * time.Second
	if *req.ExpiresInSeconds < 1 || ttl > maxServiceTTL {
		return 0, errdefs.Field("expires_in_seconds", "must be between 1 and %d", int64(maxServiceTTL/time.Second))
	}
	return ttl, nil
}

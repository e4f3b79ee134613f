package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
)

// GCP rules (type "gcp"): for requests to the rule's hosts (Google APIs by
// default) the proxy terminates TLS and sets Authorization: Bearer with an
// OAuth access token it mints from the rule's service-account key, at the
// key's own token_uri. The key never enters the sandbox; tokens are cached
// per sandbox, key and scopes until shortly before they expire.

// DefaultGCPHosts are the hosts a GCP rule without match_hosts applies to.
var DefaultGCPHosts = []string{"*.googleapis.com"}

// defaultGCPScope is asked for when a rule names no scopes.
const defaultGCPScope = "https://www.googleapis.com/auth/cloud-platform"

// gcpRenewBefore is how long before expiry a cached token is replaced.
const gcpRenewBefore = time.Minute

// GCPCredentials are a GCP rule's key (a Header value: plaintext, opaque
// or a workspace secret's name) and the OAuth scopes asked for.
type GCPCredentials struct {
	ServiceAccountJSON Header
	Scopes             []string
}

type wireGCP struct {
	ServiceAccountJSON json.RawMessage `json:"service_account_json"`
	Scopes             []string        `json:"scopes"`
}

func parseGCP(w *wireGCP) (*GCPCredentials, error) {
	if w == nil || len(w.ServiceAccountJSON) == 0 {
		return nil, fmt.Errorf("gcp.service_account_json is required")
	}
	key, err := parseSecret(w.ServiceAccountJSON, "")
	if err != nil {
		return nil, fmt.Errorf("gcp.service_account_json: %v", err)
	}
	if key.Type != "workspace_secret" {
		if _, err := google.JWTConfigFromJSON([]byte(key.Value)); err != nil {
			return nil, fmt.Errorf("gcp.service_account_json: not a service-account key file")
		}
	}
	scopes := w.Scopes
	if len(scopes) == 0 {
		scopes = []string{defaultGCPScope}
	}
	for _, sc := range scopes {
		if !strings.HasPrefix(sc, "https://") || strings.ContainsAny(sc, " \r\n") {
			return nil, fmt.Errorf("gcp.scopes: %q is not an OAuth scope URL", sc)
		}
	}
	return &GCPCredentials{ServiceAccountJSON: key, Scopes: scopes}, nil
}

// gcpToken returns an access token for rule's key on behalf of sb.
func (s *Service) gcpToken(ctx context.Context, sb *sandbox, c *GCPCredentials) (string, error) {
	key, err := s.headerValue(ctx, sb, c.ServiceAccountJSON)
	if err != nil {
		return "", fmt.Errorf("service_account_json: %w", err)
	}
	sum := sha256.Sum256([]byte(key))
	cacheKey := sb.id + "\x00" + hex.EncodeToString(sum[:]) + "\x00" + strings.Join(c.Scopes, " ")
	now := time.Now()
	if tok, ok := s.gcpTokens.get(cacheKey, now); ok {
		return tok, nil
	}
	cfg, err := google.JWTConfigFromJSON([]byte(key), c.Scopes...)
	if err != nil {
		return "", fmt.Errorf("service_account_json: not a service-account key file")
	}
	// The token endpoint is dialled like the sandbox's own traffic: the
	// daemon's resolver, the forbidden ranges and the trusted roots.
	ctx = context.WithValue(ctx, oauth2.HTTPClient, &http.Client{Transport: sb.transport, Timeout: 15 * time.Second})
	tok, err := cfg.TokenSource(ctx).Token()
	if err != nil {
		return "", fmt.Errorf("mint access token at %s: %w", cfg.TokenURL, err)
	}
	exp := tok.Expiry
	if exp.IsZero() {
		exp = now.Add(5 * time.Minute)
	}
	s.gcpTokens.put(cacheKey, tok.AccessToken, exp.Add(-gcpRenewBefore), now)
	return tok.AccessToken, nil
}

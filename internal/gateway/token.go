package gateway

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Token audiences. A token is valid only for the audience it was minted
// for, so a download link's token never opens a service port and vice versa.
const (
	AudienceService  = "service"
	AudienceDownload = "download"
)

// Claims is what a token asserts. Every field is covered by the signature;
// the gateway trusts nothing about a request's target that is not in here.
type Claims struct {
	Audience  string `json:"aud"`
	Workspace string `json:"ws"`
	Sandbox   string `json:"sid"`
	// Port is the service port (service tokens).
	Port int `json:"port,omitempty"`
	// Path, ContentType and Disposition pin a download link.
	Path        string `json:"path,omitempty"`
	ContentType string `json:"ct,omitempty"`
	Disposition string `json:"cd,omitempty"`
	// User, Role, Email and Name are who logged in, for a login-mode
	// session's token: every request re-checks that they still have
	// access (shares can be revoked), and the gateway asserts the user to
	// the service (X-Langsmith-User-*). Token-mode tokens have none: they
	// are bearer credentials.
	User  string `json:"uid,omitempty"`
	Role  string `json:"role,omitempty"`
	Email string `json:"email,omitempty"`
	Name  string `json:"name,omitempty"`
	// Embed are the origins allowed to frame the service through this
	// token (frame-ancestors); none means it may not be framed.
	Embed    []string `json:"emb,omitempty"`
	IssuedAt int64    `json:"iat"`
	// Expires is a Unix time; 0 means the token never expires (download
	// links only).
	Expires int64  `json:"exp,omitempty"`
	ID      string `json:"jti"`
}

// ExpiresAt returns the expiry as a time, zero when the token never expires.
func (c Claims) ExpiresAt() time.Time {
	if c.Expires == 0 {
		return time.Time{}
	}
	return time.Unix(c.Expires, 0).UTC()
}

// Signer mints and verifies tokens: JWTs (HS256) over Claims, keyed by one
// per-install secret. The key never leaves the daemon; rotating it (deleting
// the key file) revokes every outstanding token and link.
type Signer struct {
	key []byte
	now func() time.Time
}

// jwtHeader is the only header a Signer emits or accepts; fixing it rules
// out algorithm-confusion tricks ("alg":"none" and friends).
var jwtHeader = base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))

// b64 decodes token parts strictly: the lenient decoder ignores the unused
// low bits of a part's last character, so four spellings of one signature
// would all verify and a changed token would still be accepted.
var b64 = base64.RawURLEncoding.Strict()

// minKeyLen is the shortest secret accepted from a key file.
const minKeyLen = 32

// NewSigner returns a Signer over key (at least 32 bytes).
func NewSigner(key []byte) (*Signer, error) {
	if len(key) < minKeyLen {
		return nil, fmt.Errorf("gateway: signing key is %d bytes, want at least %d: %w", len(key), minKeyLen, errdefs.ErrInvalid)
	}
	return &Signer{key: bytes.Clone(key), now: time.Now}, nil
}

// LoadOrCreateKey reads the hex signing key at path, creating it (32 random
// bytes, mode 0600, parent directories 0700) when the file does not exist.
// A key file readable by group or others is refused: anyone who can read it
// can mint links to every sandbox.
func LoadOrCreateKey(ctx context.Context, path string, log *slog.Logger) ([]byte, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createKey(ctx, path, log)
	}
	if err != nil {
		return nil, fmt.Errorf("gateway: read signing key: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("gateway: signing key %s has mode %v; anyone who reads it can open every sandbox's services, so chmod 600 it: %w",
			path, fi.Mode().Perm(), errdefs.ErrInvalid)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, fmt.Errorf("gateway: signing key %s is not hex: %w", path, errdefs.ErrInvalid)
	}
	if len(key) < minKeyLen {
		return nil, fmt.Errorf("gateway: signing key %s is %d bytes, want at least %d: %w", path, len(key), minKeyLen, errdefs.ErrInvalid)
	}
	return key, nil
}

func createKey(ctx context.Context, path string, log *slog.Logger) ([]byte, error) {
	key := make([]byte, minKeyLen)
	rand.Read(key)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("gateway: create signing key: %w", err)
	}
	// Create-once: two daemons racing on a fresh data dir must not end up
	// with different keys; the loser reads the winner's, which is whole.
	created, err := atomicfile.Create(path, []byte(hex.EncodeToString(key)+"\n"), 0o600)
	if err != nil {
		return nil, fmt.Errorf("gateway: create signing key: %w", err)
	}
	if !created {
		return LoadOrCreateKey(ctx, path, log)
	}
	log.InfoContext(ctx, "created signing key for service URLs and download links", "path", path)
	return key, nil
}

// Sign returns the token for c, filling IssuedAt and ID.
func (s *Signer) Sign(c Claims) (string, error) {
	c.IssuedAt = s.now().Unix()
	id := make([]byte, 12)
	rand.Read(id)
	c.ID = base64.RawURLEncoding.EncodeToString(id)
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("gateway: encode claims: %w", err)
	}
	signing := jwtHeader + "." + base64.RawURLEncoding.EncodeToString(body)
	return signing + "." + base64.RawURLEncoding.EncodeToString(s.mac(signing)), nil
}

// Verify checks token's signature, audience and expiry and returns its
// claims. Every failure wraps errdefs.ErrUnauthorized; the message says which
// check failed but never echoes the token.
func (s *Signer) Verify(token, audience string) (Claims, error) {
	h, rest, ok1 := strings.Cut(token, ".")
	body, sig, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || h != jwtHeader {
		return Claims{}, fmt.Errorf("malformed token: %w", errdefs.ErrUnauthorized)
	}
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(h+"."+body)) {
		return Claims{}, fmt.Errorf("invalid token signature: %w", errdefs.ErrUnauthorized)
	}
	raw, err := b64.DecodeString(body)
	if err != nil {
		return Claims{}, fmt.Errorf("malformed token: %w", errdefs.ErrUnauthorized)
	}
	var c Claims
	if err := json.Unmarshal(raw, &c); err != nil {
		return Claims{}, fmt.Errorf("malformed token: %w", errdefs.ErrUnauthorized)
	}
	if c.Audience != audience {
		return Claims{}, fmt.Errorf("token is for %q, not %q: %w", c.Audience, audience, errdefs.ErrUnauthorized)
	}
	if c.Expires != 0 && s.now().Unix() >= c.Expires {
		return Claims{}, fmt.Errorf("token expired at %s: %w", c.ExpiresAt().Format(time.RFC3339), errdefs.ErrUnauthorized)
	}
	return c, nil
}

func (s *Signer) mac(signing string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(signing))
	return m.Sum(nil)
}

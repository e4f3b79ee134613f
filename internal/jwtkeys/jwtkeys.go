// Package jwtkeys holds the install's Ed25519 identity-signing key and mints
// the EdDSA JWTs the official clients' SandboxTokenVerifier checks: the
// X-Langsmith-User-Token the gateway sets on login-mode service requests and
// the X-LangSmith-Signature-JWT of egress proxy callbacks. Verifiers fetch
// the public key from GET /.well-known/jwks.json (JWKS).
//
// Invariant: the private key exists only in the key file (mode 0600) and in
// this process's memory; a kid is derived from the public key alone, so the
// same key always has the same kid.
package jwtkeys

import (
	"context"
	"crypto/ed25519"
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

// Signer mints EdDSA JWTs with one key, issued by one issuer (the daemon's
// public URL). Safe for concurrent use; immutable after New.
type Signer struct {
	key    ed25519.PrivateKey
	kid    string
	issuer string
	// retired keys no longer sign but stay in the JWKS, so tokens they
	// signed keep verifying until they expire.
	retired []ed25519.PublicKey
	now     func() time.Time
}

// KID is the key id of pub: base64url of the first 8 bytes of its SHA-256.
func KID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return base64.RawURLEncoding.EncodeToString(sum[:8])
}

// New returns a Signer over key issuing as issuer (trailing slashes are
// dropped: the verifiers compare iss with the issuer so trimmed), listing
// the retired keys in its JWKS too.
func New(key ed25519.PrivateKey, issuer string, retired ...ed25519.PrivateKey) (*Signer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("jwtkeys: key is %d bytes, want %d: %w", len(key), ed25519.PrivateKeySize, errdefs.ErrInvalid)
	}
	issuer = strings.TrimRight(issuer, "/")
	if issuer == "" {
		return nil, fmt.Errorf("jwtkeys: issuer is required: %w", errdefs.ErrInvalid)
	}
	s := &Signer{key: key, kid: KID(key.Public().(ed25519.PublicKey)), issuer: issuer, now: time.Now}
	for _, r := range retired {
		if len(r) == ed25519.PrivateKeySize && !r.Equal(key) {
			s.retired = append(s.retired, r.Public().(ed25519.PublicKey))
		}
	}
	return s, nil
}

// KeyID is the kid every token of s carries.
func (s *Signer) KeyID() string { return s.kid }

// Issuer is the iss every token of s carries.
func (s *Signer) Issuer() string { return s.issuer }

// Sign returns a JWT for audience and subject valid for ttl from now, with
// iss, iat, nbf, exp and a random jti, plus extra claims (which may not
// replace those).
func (s *Signer) Sign(audience, subject string, ttl time.Duration, extra map[string]any) (string, error) {
	now := s.now().Unix()
	id := make([]byte, 12)
	rand.Read(id)
	claims := map[string]any{}
	for k, v := range extra {
		claims[k] = v
	}
	for k, v := range map[string]any{
		"iss": s.issuer, "aud": audience, "sub": subject, "iat": now, "nbf": now,
		"exp": now + int64(ttl/time.Second), "jti": base64.RawURLEncoding.EncodeToString(id),
	} {
		claims[k] = v
	}
	head, err := json.Marshal(map[string]string{"alg": "EdDSA", "typ": "JWT", "kid": s.kid})
	if err != nil {
		return "", fmt.Errorf("jwtkeys: encode header: %w", err)
	}
	body, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("jwtkeys: encode claims: %w", err)
	}
	signing := base64.RawURLEncoding.EncodeToString(head) + "." + base64.RawURLEncoding.EncodeToString(body)
	return signing + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(s.key, []byte(signing))), nil
}

// JWK is one public key of a JWKS (RFC 8037 OKP).
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	Kid string `json:"kid"`
	X   string `json:"x"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// JWKS is the document served at /.well-known/jwks.json.
type JWKS struct {
	Keys []JWK `json:"keys"`
}

// JWKS returns the public key set: the signing key, then the retired ones.
func (s *Signer) JWKS() JWKS {
	out := JWKS{}
	for _, pub := range append([]ed25519.PublicKey{s.key.Public().(ed25519.PublicKey)}, s.retired...) {
		out.Keys = append(out.Keys, JWK{Kty: "OKP", Crv: "Ed25519", Kid: KID(pub), X: base64.RawURLEncoding.EncodeToString(pub), Alg: "EdDSA", Use: "sig"})
	}
	return out
}

// LoadRetired reads the retired key at path (see LoadOrCreate for the
// format), if there is one. To rotate: rename the key file to <name>.old
// and restart; the daemon creates a new key and keeps listing the old one
// until that file is deleted (after the longest token lifetime).
func LoadRetired(path string) ([]ed25519.PrivateKey, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	k, err := readKey(path)
	if err != nil {
		return nil, err
	}
	return []ed25519.PrivateKey{k}, nil
}

// LoadOrCreate reads the hex Ed25519 seed at path, creating it (mode 0600,
// parent directories 0700) on first start. A key file readable by group or
// others is refused: whoever reads it can impersonate any user to the apps
// behind service URLs and to proxy callbacks.
func LoadOrCreate(ctx context.Context, path string, log *slog.Logger) (ed25519.PrivateKey, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		seed := make([]byte, ed25519.SeedSize)
		rand.Read(seed)
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("jwtkeys: create identity key: %w", err)
		}
		// Create-once: of two daemons racing on a fresh data dir, the
		// loser reads the winner's key.
		created, err := atomicfile.Create(path, []byte(hex.EncodeToString(seed)+"\n"), 0o600)
		if err != nil {
			return nil, fmt.Errorf("jwtkeys: create identity key: %w", err)
		}
		if !created {
			return LoadOrCreate(ctx, path, log)
		}
		log.InfoContext(ctx, "created identity-signing key (JWKS)", "path", path)
		return ed25519.NewKeyFromSeed(seed), nil
	}
	return readKey(path)
}

// readKey reads the hex seed of an existing key file, refusing one that
// group or others may read.
func readKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jwtkeys: read identity key: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("jwtkeys: identity key %s has mode %v; chmod 600 it: %w", path, fi.Mode().Perm(), errdefs.ErrInvalid)
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(data)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("jwtkeys: identity key %s is not a hex Ed25519 seed: %w", path, errdefs.ErrInvalid)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

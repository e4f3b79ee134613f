// Package jwtkeystest verifies EdDSA JWTs against a JWKS the way the
// official clients' SandboxTokenVerifier does, independently of the
// signing code, for tests.
package jwtkeystest

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
)

// Verify checks token's header (alg EdDSA, a kid of jwks), signature,
// exp/iat/nbf (30 s leeway), iss (a string) and, when audience is not
// empty, aud; it returns the claims.
func Verify(jwks jwtkeys.JWKS, token, audience string) (map[string]any, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, fmt.Errorf("malformed token")
	}
	var head struct{ Alg, Kid string }
	if err := decode(parts[0], &head); err != nil {
		return nil, err
	}
	if head.Alg != "EdDSA" || head.Kid == "" {
		return nil, fmt.Errorf("header alg %q kid %q", head.Alg, head.Kid)
	}
	var pub ed25519.PublicKey
	for _, k := range jwks.Keys {
		if k.Kid == head.Kid && k.Kty == "OKP" && k.Crv == "Ed25519" {
			x, err := base64.RawURLEncoding.DecodeString(k.X)
			if err != nil {
				return nil, err
			}
			pub = x
		}
	}
	if pub == nil {
		return nil, fmt.Errorf("unknown kid %q", head.Kid)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || !ed25519.Verify(pub, []byte(parts[0]+"."+parts[1]), sig) {
		return nil, fmt.Errorf("invalid signature")
	}
	var claims map[string]any
	if err := decode(parts[1], &claims); err != nil {
		return nil, err
	}
	now := float64(time.Now().Unix())
	exp, _ := claims["exp"].(float64)
	iat, _ := claims["iat"].(float64)
	if exp == 0 || now > exp+30 || iat == 0 || iat > now+30 {
		return nil, fmt.Errorf("bad exp %v / iat %v", claims["exp"], claims["iat"])
	}
	if nbf, ok := claims["nbf"].(float64); ok && nbf > now+30 {
		return nil, fmt.Errorf("not yet valid")
	}
	if _, ok := claims["iss"].(string); !ok {
		return nil, fmt.Errorf("no iss")
	}
	if audience != "" && claims["aud"] != audience {
		return nil, fmt.Errorf("aud %v, want %q", claims["aud"], audience)
	}
	return claims, nil
}

func decode(seg string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return fmt.Errorf("malformed segment: %v", err)
	}
	return json.Unmarshal(b, v)
}

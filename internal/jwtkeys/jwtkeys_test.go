package jwtkeys_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys/jwtkeystest"
)

func TestLoadOrCreateKeepsOneKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "identity.key")
	k1, err := jwtkeys.LoadOrCreate(context.Background(), path, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, %v", fi.Mode().Perm(), err)
	}
	k2, err := jwtkeys.LoadOrCreate(context.Background(), path, slog.Default())
	if err != nil || !k1.Equal(k2) {
		t.Fatalf("second load gave another key (%v)", err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := jwtkeys.LoadOrCreate(context.Background(), path, slog.Default()); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("world-readable key accepted: %v", err)
	}
}

func TestSignVerifiesAgainstJWKS(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	s, err := jwtkeys.New(priv, "https://cubicle.example/")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := s.Sign("svc.example", "user-1", 5*time.Minute, map[string]any{"email": "a@b.c", "iss": "forged"})
	if err != nil {
		t.Fatal(err)
	}
	// Through JSON, as a verifier fetches it.
	raw, _ := json.Marshal(s.JWKS())
	var set jwtkeys.JWKS
	if err := json.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 || set.Keys[0].Kid != s.KeyID() || set.Keys[0].Kty != "OKP" || set.Keys[0].Crv != "Ed25519" {
		t.Fatalf("jwks %s", raw)
	}
	c, err := jwtkeystest.Verify(set, tok, "svc.example")
	if err != nil {
		t.Fatal(err)
	}
	if c["sub"] != "user-1" || c["email"] != "a@b.c" || c["iss"] != "https://cubicle.example" {
		t.Fatalf("claims %v", c)
	}
	if exp, iat := c["exp"].(float64), c["iat"].(float64); exp-iat != 300 {
		t.Fatalf("exp-iat = %v", exp-iat)
	}
	if _, err := jwtkeystest.Verify(set, tok, "other.example"); err == nil {
		t.Fatal("wrong audience verified")
	}
	_, other, _ := ed25519.GenerateKey(nil)
	forger, _ := jwtkeys.New(other, "https://cubicle.example")
	forged, _ := forger.Sign("svc.example", "user-1", time.Minute, nil)
	if _, err := jwtkeystest.Verify(set, forged, "svc.example"); err == nil {
		t.Fatal("token of another key verified")
	}
}

// TestRotation: after the key file is renamed to .old, a new key signs and
// tokens of the old one still verify against the JWKS.
func TestRotation(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "identity.key")
	oldKey, err := jwtkeys.LoadOrCreate(ctx, path, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	oldSigner, _ := jwtkeys.New(oldKey, "https://c.example")
	oldTok, _ := oldSigner.Sign("svc", "u", time.Minute, nil)
	if none, err := jwtkeys.LoadRetired(path + ".old"); err != nil || none != nil {
		t.Fatalf("no retired key: %v %v", none, err)
	}
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	newKey, err := jwtkeys.LoadOrCreate(ctx, path, slog.Default())
	if err != nil || newKey.Equal(oldKey) {
		t.Fatalf("no new key after rotation: %v", err)
	}
	retired, err := jwtkeys.LoadRetired(path + ".old")
	if err != nil || len(retired) != 1 {
		t.Fatalf("retired: %v %v", retired, err)
	}
	s, _ := jwtkeys.New(newKey, "https://c.example", retired...)
	newTok, _ := s.Sign("svc", "u", time.Minute, nil)
	set := s.JWKS()
	if len(set.Keys) != 2 || set.Keys[0].Kid != s.KeyID() {
		t.Fatalf("jwks after rotation: %+v", set)
	}
	for name, tok := range map[string]string{"old": oldTok, "new": newTok} {
		if _, err := jwtkeystest.Verify(set, tok, "svc"); err != nil {
			t.Errorf("%s key's token: %v", name, err)
		}
	}
}

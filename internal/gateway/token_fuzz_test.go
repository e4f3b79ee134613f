package gateway

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// FuzzVerify checks the token verifier against arbitrary input. Two
// properties: a token that was not signed with the verifier's key is never
// accepted (the seeds include tokens signed with another key), and a token
// that was signed is never accepted once any one of its bytes is changed.
// Every refusal wraps errdefs.ErrUnauthorized.
func FuzzVerify(f *testing.F) {
	key := bytes.Repeat([]byte{7}, minKeyLen)
	signer, err := NewSigner(key)
	if err != nil {
		f.Fatal(err)
	}
	other, _ := NewSigner(bytes.Repeat([]byte{9}, minKeyLen))
	forged, _ := other.Sign(Claims{Audience: AudienceService, Workspace: "ws", Sandbox: "sb", Port: 80})
	for _, tok := range []string{"", ".", "..", jwtHeader + "..", forged,
		`eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJhdWQiOiJzZXJ2aWNlIn0.`} {
		f.Add(tok, AudienceService, "sb", 80, int64(0), uint(0), byte(0))
	}
	f.Add("", AudienceDownload, "sb", 0, time.Now().Add(time.Hour).Unix(), uint(170), byte('A'))
	sample, _ := signer.Sign(Claims{Audience: AudienceService, Sandbox: "sb", Port: 80})
	for b := range byte(4) { // the signature's last character, low bits flipped
		f.Add("", AudienceService, "sb", 80, int64(0), uint(len(sample)-1), b)
	}
	f.Fuzz(func(t *testing.T, raw, aud, sid string, port int, exp int64, pos uint, b byte) {
		if _, err := signer.Verify(raw, aud); err == nil {
			t.Fatalf("Verify accepted a token not signed by this key: %q", raw)
		} else if !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Fatalf("Verify error %v does not wrap ErrUnauthorized", err)
		}
		c := Claims{Audience: aud, Sandbox: sid, Port: port, Expires: exp}
		tok, err := signer.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := signer.Verify(tok, aud)
		// JSON carries strings as UTF-8, so only valid ones round-trip.
		if err == nil && utf8.ValidString(sid) && (got.Audience != aud || got.Sandbox != sid || got.Port != port || got.Expires != exp) {
			t.Fatalf("Verify returned %+v for a token of %+v", got, c)
		}
		i := int(pos % uint(len(tok)))
		tampered := tok[:i] + string([]byte{tamper(tok[i], b)}) + tok[i+1:]
		if _, err := signer.Verify(tampered, aud); err == nil {
			t.Fatalf("Verify accepted %q, token %q with byte %d changed to %q", tampered, tok, i, b)
		}
	})
}

// tamper returns a byte other than c: within the base64url alphabet when c
// is in it (so the token still decodes and only the signature can refuse
// it), otherwise b or, if b is c, its complement.
func tamper(c, b byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	if i := strings.IndexByte(alphabet, c); i >= 0 {
		return alphabet[i^(int(b)%63+1)]
	}
	if b == c {
		return ^b
	}
	return b
}

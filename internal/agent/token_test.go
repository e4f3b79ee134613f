package agent

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestRotateToken checks that POST /v1/token replaces the token: the old
// one is refused from then on, the new one works, and a malformed token or
// an unauthenticated request changes nothing.
func TestRotateToken(t *testing.T) {
	c, _, addr := startAgent(t)
	ctx := ctxT(t)
	fresh := strings.Repeat("ab12", 16)
	if err := c.RotateToken(ctx, "short"); !isStatus(err, http.StatusBadRequest) {
		t.Fatalf("rotate to a short token: %v, want 400", err)
	}
	stranger := NewClient(addr, "not-the-token")
	defer stranger.Close()
	if err := stranger.RotateToken(ctx, fresh); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("rotate without the token: %v, want 401", err)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatalf("token changed by refused rotations: %v", err)
	}
	if err := c.RotateToken(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	if err := c.Health(ctx); err != nil {
		t.Fatalf("rotated client: %v", err)
	}
	old := NewClient(addr, testToken)
	defer old.Close()
	if err := old.Health(ctx); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("old token after rotation: %v, want 401", err)
	}
	if _, err := old.DialExec(ctx); !isStatus(err, http.StatusUnauthorized) {
		t.Fatalf("exec with the old token: %v, want 401", err)
	}
}

// TestReadToken checks that the token is read from a pipe up to EOF and
// that the pipe is replaced by /dev/null, so no later reader finds it.
func TestReadToken(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.WriteString("s3cret-token\n")
	w.Close()
	tok, err := ReadToken(r)
	if err != nil || tok != "s3cret-token" {
		t.Fatalf("ReadToken = %q, %v", tok, err)
	}
	fi, err := r.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("stdin after ReadToken: %v, %v; want /dev/null", fi.Mode(), err)
	}
	r2, w2, _ := os.Pipe()
	defer r2.Close()
	w2.Close()
	if _, err := ReadToken(r2); err == nil {
		t.Fatal("empty stdin accepted")
	}
}

func isStatus(err error, status int) bool {
	var he *HTTPError
	return errors.As(err, &he) && he.Status == status
}

package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestCallsHaveDeadline: against an agent that accepts connections but
// never answers (a stopped Sentry, say), every short call and the exec
// handshake fail once the client's answer bound passes, even when the
// caller's context has no deadline.
func TestCallsHaveDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	c := NewClient(strings.TrimPrefix(srv.URL, "http://"), testToken)
	defer c.Close()
	c.answer = 200 * time.Millisecond
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"health":   func() error { return c.Health(ctx) },
		"stat":     func() error { _, err := c.Stat(ctx, "", "/etc"); return err },
		"activity": func() error { _, err := c.Activity(ctx); return err },
		"memguard": func() error { _, err := c.MemGuard(ctx); return err },
		"token":    func() error { return c.RotateToken(ctx, strings.Repeat("ab12", 16)) },
		"exec":     func() error { _, err := c.DialExec(ctx); return err },
	} {
		t0 := time.Now()
		err := call()
		if took := time.Since(t0); err == nil || took > 5*time.Second {
			t.Errorf("%s: %v after %v, want an error after about %v", name, err, took, c.answer)
		}
		var ne net.Error
		if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s: %v is not a timeout", name, err)
		}
	}
}

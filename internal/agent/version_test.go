package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHealthReportsProtocolVersion: this build's agent and client agree.
func TestHealthReportsProtocolVersion(t *testing.T) {
	c, _, _ := startAgent(t)
	if err := c.WaitReady(ctxT(t), 2*time.Millisecond); err != nil {
		t.Fatalf("WaitReady against this build's agent: %v", err)
	}
}

// TestWaitReadyRefusesOtherProtocol: an agent of another build (one from
// before versioning answers without "protocol"; a newer one with another
// number) is refused at once with a *VersionError, not retried until the
// boot times out and not accepted half-working.
func TestWaitReadyRefusesOtherProtocol(t *testing.T) {
	for _, body := range []string{`{"ok":true}`, fmt.Sprintf(`{"ok":true,"protocol":%d}`, ProtocolVersion+1)} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, body)
		}))
		c := NewClient(strings.TrimPrefix(srv.URL, "http://"), "tok")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		start := time.Now()
		err := c.WaitReady(ctx, 2*time.Millisecond)
		cancel()
		c.Close()
		srv.Close()
		var ve *VersionError
		if !errors.Is(err, ErrProtocolVersion) || !errors.As(err, &ve) {
			t.Fatalf("agent answering %s: WaitReady = %v, want a VersionError", body, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("agent answering %s: refused after %v, want at once", body, d)
		}
		if !strings.Contains(err.Error(), "restart the sandbox") {
			t.Errorf("error %q does not say what to do", err)
		}
	}
}

package proxy

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"
)

// TestProbeReportsAStoppedListener: the health probe passes while the
// accept loop runs and names the cause once the listener is gone.
func TestProbeReportsAStoppedListener(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{ln: ln, conns: newChanListener(ln.Addr()), log: slog.New(slog.DiscardHandler)}
	done := make(chan struct{})
	go func() { s.acceptLoop(); close(done) }()
	if err := s.Probe(context.Background()); err != nil {
		t.Fatalf("probe of a serving proxy: %v", err)
	}
	ln.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("accept loop did not end")
	}
	if err := s.Probe(context.Background()); err == nil || !strings.Contains(err.Error(), "listener closed") {
		t.Fatalf("probe after the listener closed: %v", err)
	}
}

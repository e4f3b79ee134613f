package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/cubicle-dev/cubicle/internal/connlimit"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ConnLimits bound what one client can hold of the daemon's connections.
// The API, signed links (/d/) and service URLs (/s/) share one listener
// and face unauthenticated callers, so these apply before any credential
// is read.
//
// There is deliberately no whole-request read or write timeout: exec
// WebSocket streams, long polls, uploads, downloads and wait_for_ready
// creates may each last up to an hour. Only the phases where a peer holds a
// connection without asking for anything are timed.
type ConnLimits struct {
	// HeaderTimeout bounds reading a request's headers, from the moment
	// the server waits for them (a fresh connection that sends nothing, a
	// slow-loris header trickle).
	HeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a keep-alive
	// connection.
	IdleTimeout time.Duration
	// MaxConnsPerClient caps open connections per client (an IPv4
	// address, an IPv6 /64); 0 means no cap. Over the cap a connection
	// gets a 503 and is closed.
	MaxConnsPerClient int
}

// DefaultConnLimits are the daemon's defaults. The idle timeout outlasts
// common clients' own (Go's is 90 s), so clients close idle connections
// first and never race a request against the server's close.
func DefaultConnLimits() ConnLimits {
	return ConnLimits{HeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxConnsPerClient: 256}
}

// NewHTTPServer returns the daemon's HTTP server for h under l. Serve it on
// a listener wrapped by LimitListener.
func NewHTTPServer(h http.Handler, l ConnLimits, log *slog.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.HeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	if s, ok := h.(*Server); ok {
		// Shutdown waits for open responses; long-lived streams are told
		// to end so they do not hold it for its whole grace period.
		srv.RegisterOnShutdown(s.drain)
	}
	return srv
}

// LimitListener wraps ln so that each client holds at most max open
// connections (max <= 0: ln unchanged; see internal/connlimit). A
// connection over the cap is answered with a 503 in the protocol's error
// form and closed at once, so the client learns why; it never reaches the
// HTTP server.
func LimitListener(ln net.Listener, max int, log *slog.Logger) net.Listener {
	refusal := overCapResponse(max)
	return connlimit.Listen(ln, max, func(c *net.TCPConn) {
		// The socket is fresh, so the short write fits its send buffer;
		// the deadline bounds a peer that advertises no window.
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(refusal)
		_ = c.CloseWrite()
		_ = c.Close()
		log.Debug("connection over the per-client cap refused", "client", c.RemoteAddr().String(), "cap", max)
	})
}

// overCapResponse is the raw HTTP response for a connection over the cap.
func overCapResponse(max int) []byte {
	body, _ := json.Marshal(protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "TooManyConnections",
		Message: fmt.Sprintf("this client already holds %d connections to the server; close some and retry", max)}})
	resp := &http.Response{
		StatusCode: http.StatusServiceUnavailable, ProtoMajor: 1, ProtoMinor: 1, Close: true,
		Header:        http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
	}
	var b bytes.Buffer
	_ = resp.Write(&b)
	return b.Bytes()
}

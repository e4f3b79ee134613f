package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

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
	// MaxConnsPerClient caps open connections per client address (an IPv4
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
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.HeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
}

// LimitListener wraps ln so that each client holds at most max open
// connections (max <= 0: ln unchanged). A connection over the cap is
// answered with a 503 in the protocol's error form and closed at once, so
// the client learns why; it never reaches the HTTP server.
func LimitListener(ln net.Listener, max int, log *slog.Logger) net.Listener {
	if max <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, max: max, log: log, open: map[netip.Prefix]int{}, refusal: overCapResponse(max)}
}

type limitListener struct {
	net.Listener
	max     int
	log     *slog.Logger
	refusal []byte

	mu   sync.Mutex
	open map[netip.Prefix]int // connections open per client key
}

// Accept returns the next connection within its client's cap, refusing
// those over it.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil // not an IP peer: nothing to key on
		}
		key := clientKey(tc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
		l.mu.Lock()
		over := l.open[key] >= l.max
		if !over {
			l.open[key]++
		}
		l.mu.Unlock()
		if !over {
			return &limitedConn{TCPConn: tc, release: func() { l.release(key) }}, nil
		}
		go l.refuse(tc, key) // never hold up the accept loop
	}
}

// refuse writes the 503 and closes c. The socket is fresh, so the short
// write fits its send buffer; the deadline bounds a peer that advertises
// no window.
func (l *limitListener) refuse(c *net.TCPConn, key netip.Prefix) {
	_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, _ = c.Write(l.refusal)
	_ = c.CloseWrite()
	_ = c.Close()
	l.log.Debug("connection over the per-client cap refused", "client", key.String(), "cap", l.max)
}

func (l *limitListener) release(key netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// clientKey is the unit a cap applies to: one IPv4 address, or the /64 an
// IPv6 host can pick addresses from at will.
func clientKey(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// limitedConn gives its client's slot back when closed (once). It embeds
// *net.TCPConn so the HTTP server keeps sendfile (ReadFrom) and CloseWrite.
type limitedConn struct {
	*net.TCPConn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.TCPConn.Close()
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

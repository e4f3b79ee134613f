package mcp

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Loopback is an in-memory listener and the HTTP client that dials it.
// The daemon serves its API on a Loopback too (the same http.Server and
// handler as its TCP listener), and its /mcp tools call the API through
// Client: every call passes the API's whole request path — authentication
// of the caller's key, rate limit, authorization, the access audit and
// the record — exactly as an outside client's would, WebSocket exec
// included, without a TCP hop through the public listener, whose
// per-client connection cap would otherwise count every MCP user as one
// loopback client, and whatever --public-url says (it may not be
// reachable from the daemon's own host).
type Loopback struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

// NewLoopback returns an open Loopback.
func NewLoopback() *Loopback {
	return &Loopback{conns: make(chan net.Conn), done: make(chan struct{})}
}

// loopbackAddr names both ends of a Loopback connection (the access
// audit's remote address of MCP tool calls).
type loopbackAddr struct{}

func (loopbackAddr) Network() string { return "memory" }
func (loopbackAddr) String() string  { return "mcp" }

// loopbackConn is one end of a pipe that names its addresses.
type loopbackConn struct{ net.Conn }

func (loopbackConn) LocalAddr() net.Addr  { return loopbackAddr{} }
func (loopbackConn) RemoteAddr() net.Addr { return loopbackAddr{} }

// Accept implements net.Listener.
func (l *Loopback) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close implements net.Listener; later dials fail.
func (l *Loopback) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr implements net.Listener.
func (l *Loopback) Addr() net.Addr { return loopbackAddr{} }

// dial hands the server end of a new pipe to Accept.
func (l *Loopback) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- loopbackConn{server}:
		return loopbackConn{client}, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, errors.New("the daemon's API has stopped")
}

// Client returns an HTTP client whose every request, whatever its URL's
// scheme and host (the daemon's public URL, dataplane URLs under it),
// goes over a Loopback connection as plain HTTP; the Host header is kept.
func (l *Loopback) Client() *http.Client {
	t := &http.Transport{DialContext: l.dial, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second}
	return &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.URL.Scheme = "http"
		return t.RoundTrip(r)
	})}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// bufConn is a connection whose first bytes were peeked into r.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// connMeta is what the proxy knows about a connection it hands to its
// HTTP server.
type connMeta struct {
	sb  *sandbox
	od  netip.AddrPort // original destination
	sni string         // set for intercepted TLS
}

// meteredConn carries connMeta to the HTTP server's ConnContext.
type meteredConn struct {
	net.Conn
	meta *connMeta
}

type metaKey struct{}

func connContext(ctx context.Context, c net.Conn) context.Context {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if mc, ok := c.(*meteredConn); ok {
		return context.WithValue(ctx, metaKey{}, mc.meta)
	}
	return ctx
}

func metaFrom(ctx context.Context) *connMeta {
	m, _ := ctx.Value(metaKey{}).(*connMeta)
	return m
}

// chanListener is a net.Listener fed by push: the HTTP server serves
// connections the proxy has already classified.
type chanListener struct {
	addr net.Addr
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }

// errHelloRead stops the handshake once the ClientHello is parsed.
var errHelloRead = errors.New("client hello read")

// peekClientHello reads the TLS ClientHello from c and returns its server
// name and the bytes consumed, to be replayed to whoever handles the
// connection next. crypto/tls does the parsing: the handshake is aborted
// from GetConfigForClient, before anything is written.
func peekClientHello(c net.Conn) (sni string, consumed []byte, err error) {
	var rec bytes.Buffer
	ro := &readOnlyConn{r: io.TeeReader(c, &rec), Conn: c}
	err = tls.Server(ro, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni = h.ServerName
		return nil, errHelloRead
	}}).Handshake()
	if !errors.Is(err, errHelloRead) {
		return "", nil, err
	}
	return sni, rec.Bytes(), nil
}

// readOnlyConn refuses writes, so an aborted handshake sends no alert.
type readOnlyConn struct {
	net.Conn
	r io.Reader
}

func (c *readOnlyConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *readOnlyConn) Write(p []byte) (int, error) { return 0, io.ErrClosedPipe }

// handleTLS enforces the policy on a TLS connection's SNI, then either
// splices it to the destination untouched or, for a rule-matched host,
// terminates it and hands it to the HTTP server for header injection.
func (s *Service) handleTLS(sb *sandbox, c *bufConn, od netip.AddrPort) {
	sni, hello, err := peekClientHello(c)
	if err != nil {
		reset(c.Conn.(tcpConn))
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	replay := &bufConn{Conn: c.Conn, r: io.MultiReader(bytes.NewReader(hello), c.r)}
	sni = normHost(sni)
	pol := sb.policy.Load()
	target, v := decide(pol, sni, od)
	ev := Event{Time: time.Now().UTC(), Kind: "tls", Host: sni, Dest: od.String(), Allowed: v.Allowed, Reason: v.Reason}
	if !v.Allowed {
		s.deny(sb, ev)
		s.recordConn(sb, ev, 0, 0)
		reset(c.Conn.(tcpConn))
		return
	}
	if sni != "" && target == sni && pol.Intercepts(sni) {
		meta := &connMeta{sb: sb, od: od, sni: sni}
		tc := tls.Server(&meteredConn{Conn: replay, meta: meta}, &tls.Config{
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.ca.Leaf(sni) },
			NextProtos:     []string{"http/1.1"},
			MinVersion:     tls.VersionTLS12,
		})
		s.conns.push(tc) // the HTTP server runs the handshake
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	up, err := s.dial(ctx, sb, target, od.Port())
	cancel()
	if err != nil {
		ev.Allowed, ev.Reason = false, err.Error()
		s.deny(sb, ev)
		s.recordConn(sb, ev, 0, 0)
		reset(c.Conn.(tcpConn))
		return
	}
	sb.log.add(ev, false)
	toUp, toSandbox := splice(replay, up)
	s.cfg.Meter.EgressBytes(toUp, toSandbox)
	s.recordConn(sb, ev, toUp, toSandbox)
}

// splice copies both ways until both directions end, half-closing as each
// side finishes so protocols that rely on EOF work. It returns the bytes
// copied from a to b and from b to a.
func splice(a, b net.Conn) (aToB, bToA int64) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		*n, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else if bc, ok := dst.(*bufConn); ok {
			if tc, ok := bc.Conn.(tcpConn); ok {
				_ = tc.CloseWrite()
			}
		}
	}
	wg.Add(2)
	go cp(b, a, &aToB)
	go cp(a, b, &bToA)
	wg.Wait()
	a.Close()
	b.Close()
	return aToB, bToA
}

// decide applies pol to a connection for host (may be "") originally sent
// to od, and returns where to dial: host itself when the name is allowed,
// od's address when only the address is (then the proxy connects exactly
// where the sandbox asked, which the packet policy would allow too).
//
// Without a proxy_config the proxy is a pass-through: everything is
// allowed and it dials exactly the address the sandbox asked for, as if
// it were not in the path (it is only there to record the traffic).
func decide(pol *Policy, host string, od netip.AddrPort) (target string, v Verdict) {
	if !pol.Proxied() {
		return od.Addr().String(), Verdict{true, ReasonPassThrough}
	}
	byAddr := pol.CheckAddr(od.Addr())
	if host == "" {
		return od.Addr().String(), byAddr
	}
	v = pol.CheckHost(host)
	switch pol.Mode {
	case ModeAllow:
		if v.Allowed {
			return host, v
		}
		if byAddr.Allowed {
			return od.Addr().String(), byAddr
		}
		return "", v
	case ModeDeny:
		if !v.Allowed {
			return "", v
		}
		if !byAddr.Allowed {
			return "", byAddr
		}
	}
	return host, v
}

// hostOnly strips a port from a Host header value.
func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

func joinHostPort(h string, p uint16) string { return net.JoinHostPort(h, strconv.Itoa(int(p))) }

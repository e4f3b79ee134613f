// Package connlimit caps the connections each client holds on a TCP
// listener, so that no single caller can exhaust the daemon's file
// descriptors. A client is an IPv4 address or an IPv6 /64 (an IPv6 host
// picks addresses within its /64 at will).
package connlimit

import (
	"net"
	"net/netip"
	"sync"
)

// Listen wraps ln so that each client holds at most max open connections
// (max <= 0: ln unchanged). A connection over the cap never leaves Accept:
// refuse gets it, on its own goroutine so the accept loop never waits, and
// must close it. Accepted connections are *Conn (or, for peers without an
// IP address, whatever ln returned).
func Listen(ln net.Listener, max int, refuse func(*net.TCPConn)) net.Listener {
	if max <= 0 {
		return ln
	}
	return &listener{Listener: ln, max: max, refuse: refuse, open: map[netip.Prefix]int{}}
}

type listener struct {
	net.Listener
	max    int
	refuse func(*net.TCPConn)

	mu   sync.Mutex
	open map[netip.Prefix]int // open connections per client
}

// Accept returns the next connection within its client's cap.
func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			return c, nil // not an IP peer: nothing to key on
		}
		key := Client(tc.RemoteAddr().(*net.TCPAddr).AddrPort().Addr())
		l.mu.Lock()
		over := l.open[key] >= l.max
		if !over {
			l.open[key]++
		}
		l.mu.Unlock()
		if !over {
			return &Conn{TCPConn: tc, release: func() { l.release(key) }}, nil
		}
		go l.refuse(tc)
	}
}

func (l *listener) release(key netip.Prefix) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

// Client is the unit a cap applies to: one IPv4 address (IPv4-mapped
// IPv6 included), or an IPv6 /64.
func Client(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = 64
	}
	p, _ := a.Prefix(bits)
	return p
}

// Conn is an accepted connection; closing it (once) gives its client's
// slot back. It embeds *net.TCPConn, so users keep sendfile (ReadFrom),
// CloseWrite, SetLinger and the raw socket.
type Conn struct {
	*net.TCPConn
	once    sync.Once
	release func()
}

// Close closes the connection and frees its slot.
func (c *Conn) Close() error {
	c.once.Do(c.release)
	return c.TCPConn.Close()
}

package vport

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// hangupWait is how long the guest waits before reading again while no
// host is connected (a read then returns at once with nothing).
const hangupWait = 100 * time.Millisecond

// chunk is one read from the port: data, or a hangup (the host end is not
// connected), or the error that ended reading.
type chunk struct {
	data   []byte
	hangup bool
	err    error
}

// Listener is the guest's end: it serves the sessions the host opens on
// the port, one at a time, and hands their streams to Accept.
//
// One goroutine reads the port (reads), one runs the handshakes and
// sessions (serve); writes of every session go through wmu, so a write
// blocked while the host was away finishes before the next session
// writes anything.
type Listener struct {
	port  io.ReadWriter
	log   *slog.Logger
	wmu   sync.Mutex
	reads chan chunk
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Listen serves the agent API's connections from port (the guest's
// virtio-serial device, open for reading and writing). The port is never
// closed here: it outlives every session.
func Listen(port io.ReadWriter, log *slog.Logger) *Listener {
	l := &Listener{port: port, log: log, reads: make(chan chunk), conns: make(chan net.Conn), done: make(chan struct{})}
	go l.read()
	go l.serve()
	return l
}

// Accept returns the next stream of the current session.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; streams already accepted are the caller's.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr names the port.
func (l *Listener) Addr() net.Addr { return addr{} }

type addr struct{}

func (addr) Network() string { return "vport" }
func (addr) String() string  { return "virtio-serial" }

func (l *Listener) read() {
	b := make([]byte, 64<<10)
	for {
		n, err := l.port.Read(b)
		// The consumer keeps a chunk past the next read: it gets a copy.
		c := chunk{data: append([]byte(nil), b[:n]...)}
		switch {
		case n > 0:
		case err == nil || errors.Is(err, io.EOF):
			c.hangup = true
		default:
			c.err = err
		}
		select {
		case l.reads <- c:
		case <-l.done:
			return
		}
		if c.err != nil {
			return
		}
		if c.hangup {
			select {
			case <-time.After(hangupWait):
			case <-l.done:
				return
			}
		}
	}
}

func (l *Listener) write(b []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.port.Write(b)
	return err
}

// serve runs handshake, session, handshake, ... until the port fails or
// the listener is closed.
func (l *Listener) serve() {
	defer l.Close()
	var pending []byte
	for {
		rest, err := l.handshake(pending)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				l.log.Warn("agent port failed", "err", err)
			}
			return
		}
		c := &sessionConn{l: l, buf: rest, closed: make(chan struct{})}
		pending = l.runSession(c)
	}
}

// handshake scans pending and then the port for a hello, answers each new
// nonce with ready, and returns the bytes after the start of the nonce
// answered last: the session's.
func (l *Listener) handshake(pending []byte) ([]byte, error) {
	s := scanner{prefixes: []string{helloPrefix, startPrefix}}
	answered := ""
	b := pending
	for {
		for {
			nonce, rest, ok := s.feed(b)
			if !ok {
				break
			}
			b = rest
			switch {
			case s.prefix == startPrefix && nonce == answered:
				return rest, nil
			case s.prefix == helloPrefix && nonce != answered:
				if err := l.write([]byte(readyPrefix + nonce + "\n")); err != nil {
					return nil, fmt.Errorf("handshake answer: %w", err)
				}
				answered = nonce
			}
		}
		select {
		case c := <-l.reads:
			if c.err != nil {
				return nil, c.err
			}
			if c.hangup {
				s.reset()
				b = nil
				continue
			}
			b = c.data
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// runSession serves one session over c until it ends and returns what c
// had read past it, for the next scan.
func (l *Listener) runSession(c *sessionConn) []byte {
	sess, err := yamux.Server(c, config())
	if err != nil { // only for an invalid config
		l.log.Warn("agent port: session", "err", err)
		return nil
	}
	go func() {
		select {
		case <-sess.CloseChan():
		case <-l.done:
			sess.Close()
		}
	}()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			break
		}
		select {
		case l.conns <- st:
		case <-l.done:
			st.Close()
		}
	}
	sess.Close()
	left := c.finish()
	if !c.hungUp {
		// The host may still be connected to a session that is gone
		// here: tell it so (see reset).
		l.write(reset)
	}
	return left
}

// sessionConn is one session's view of the port. Close does not close
// the port: it ends the session's reads.
type sessionConn struct {
	l      *Listener
	rmu    sync.Mutex // held by Read; finish takes it to end reading
	buf    []byte
	hungUp bool // the session ended because the host went away
	ended  bool
	closed chan struct{}
	once   sync.Once
}

func (c *sessionConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.buf) == 0 {
		if c.ended {
			return 0, io.EOF
		}
		select {
		case r := <-c.l.reads:
			switch {
			case r.err != nil:
				c.ended = true
				return 0, r.err
			case r.hangup:
				c.hungUp, c.ended = true, true
				return 0, io.EOF
			}
			c.buf = r.data
		case <-c.closed:
			return 0, io.EOF
		case <-c.l.done:
			return 0, io.EOF
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *sessionConn) Write(p []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, io.ErrClosedPipe
	default:
	}
	if err := c.l.write(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *sessionConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// finish ends reading for good and returns the bytes read but not
// consumed: a chunk the session's reader took as it was closing may hold
// the next hello.
func (c *sessionConn) finish() []byte {
	c.Close()
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.ended = true
	left := c.buf
	c.buf = nil
	return left
}

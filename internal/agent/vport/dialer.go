package vport

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// HandshakeTimeout bounds one handshake: from the host's connect until the
// guest's ready. It covers a boot (the guest opens the port only once its
// init has mounted the root), which under TCG takes seconds; a caller that
// gives up sooner leaves the handshake running for the next Dial, so a
// hello is never abandoned half answered.
const HandshakeTimeout = 60 * time.Second

// helloAgain is how long the host waits for ready before it says hello
// again.
const helloAgain = 500 * time.Millisecond

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Dialer is the host's end of one VM's port: it keeps one session and
// opens a stream per Dial, reconnecting once the session has ended.
type Dialer struct {
	connect func(context.Context) (net.Conn, error)

	mu      sync.Mutex
	sess    *yamux.Session
	pending *attempt // the handshake under way, if any
	closed  bool
}

// attempt is one handshake; done is closed once it ended, err set if it
// failed (a success is the Dialer's sess).
type attempt struct {
	done chan struct{}
	err  error
}

// NewDialer returns a Dialer whose connect reaches the VM's chardev
// socket.
func NewDialer(connect func(context.Context) (net.Conn, error)) *Dialer {
	return &Dialer{connect: connect}
}

// ErrClosed is returned by Dial after Close.
var ErrClosed = errors.New("vport: dialer closed")

// Dial opens a stream to the agent.
func (d *Dialer) Dial(ctx context.Context) (net.Conn, error) {
	for try := 0; ; try++ {
		s, a, err := d.session()
		if err != nil {
			return nil, err
		}
		if s == nil {
			select {
			case <-a.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if a.err != nil {
				return nil, a.err
			}
			continue
		}
		st, err := s.OpenStream()
		if err == nil {
			return st, nil
		}
		// The session ended since it was found: once more with a new one.
		if try > 0 {
			return nil, fmt.Errorf("open stream to agent: %w", err)
		}
	}
}

// session returns the live session, or the handshake to wait for (one is
// started when there is none).
func (d *Dialer) session() (*yamux.Session, *attempt, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, nil, ErrClosed
	}
	if d.sess != nil && !d.sess.IsClosed() {
		return d.sess, nil, nil
	}
	d.sess = nil
	if d.pending == nil {
		a := &attempt{done: make(chan struct{})}
		d.pending = a
		go d.handshake(a)
	}
	return nil, d.pending, nil
}

func (d *Dialer) handshake(a *attempt) {
	sess, err := d.open()
	d.mu.Lock()
	d.pending = nil
	if d.closed && sess != nil {
		sess.Close()
		sess, err = nil, ErrClosed
	}
	d.sess, a.err = sess, err
	d.mu.Unlock()
	close(a.done)
}

// open connects, says hello and waits for the guest's ready, within
// HandshakeTimeout.
func (d *Dialer) open() (*yamux.Session, error) {
	ctx, cancel := context.WithTimeout(context.Background(), HandshakeTimeout)
	defer cancel()
	conn, err := d.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to agent port: %w", err)
	}
	fail := func(err error) (*yamux.Session, error) {
		conn.Close()
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	conn.SetWriteDeadline(deadline)
	b := make([]byte, nonceLen/2)
	rand.Read(b)
	nonce := hex.EncodeToString(b)
	hello := []byte(helloPrefix + nonce + "\n")
	s := scanner{prefixes: []string{readyPrefix}}
	buf := make([]byte, 4096)
	var rest []byte
	for found := false; !found; {
		// Said again until answered: the guest may have taken an
		// earlier hello for bytes of the session before (when this
		// connection followed the last one before the guest saw it go,
		// nothing told it), and the guest answers a nonce once.
		if _, err := conn.Write(hello); err != nil {
			return fail(fmt.Errorf("agent port hello: %w", err))
		}
		conn.SetReadDeadline(minTime(deadline, time.Now().Add(helloAgain)))
		for !found {
			n, err := conn.Read(buf)
			// A ready for another nonce (a late answer to an earlier
			// connection's hello) is skipped; the bytes after it
			// scanned on.
			for b := buf[:n]; ; {
				got, r, ok := s.feed(b)
				if !ok {
					break
				}
				if b = r; got == nonce {
					rest, found = r, true
					break
				}
			}
			var ne net.Error
			if err != nil && !found {
				if errors.As(err, &ne) && ne.Timeout() && time.Now().Before(deadline) {
					break // hello again
				}
				return fail(fmt.Errorf("agent port: wait for the guest's answer: %w", err))
			}
		}
	}
	if _, err := conn.Write([]byte(startPrefix + nonce + "\n")); err != nil {
		return fail(fmt.Errorf("agent port start: %w", err))
	}
	conn.SetDeadline(time.Time{})
	sess, err := yamux.Client(&prefixConn{Conn: conn, rest: rest}, config())
	if err != nil {
		return fail(err)
	}
	return sess, nil
}

// Close ends the session and every stream of it; Dial fails from now on.
func (d *Dialer) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	if d.sess != nil {
		d.sess.Close()
		d.sess = nil
	}
}

// prefixConn reads rest (what came with the guest's ready: the session's
// first bytes) before the rest of the connection.
type prefixConn struct {
	net.Conn
	rest []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.rest) > 0 {
		n := copy(p, c.rest)
		c.rest = c.rest[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

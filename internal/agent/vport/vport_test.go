package vport

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakePort is a test double of a virtio-serial port (a guest kernel's
// device and QEMU's chardev socket cannot run in a unit test; the microvm
// driver's tests run the real ones). It keeps the semantics the protocol
// is built for: the guest end outlives host connections, a guest read
// returns 0 while no host is connected, a guest write blocks until one is,
// and whatever a connection's peer had not read is lost with it.
type fakePort struct {
	mu    sync.Mutex
	cond  *sync.Cond
	guest net.Conn // the current connection's guest side, nil when none
	// junk is written to the guest's reads at the next connect, before
	// the host's first byte: bytes of an earlier connection still in the
	// queue.
	junk []byte
}

func newFakePort() *fakePort {
	p := &fakePort{}
	p.cond = sync.NewCond(&p.mu)
	return p
}

// connect is the host's connect: it replaces any current connection.
func (p *fakePort) connect(context.Context) (net.Conn, error) {
	host, guest, err := socketPair()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.guest != nil {
		p.guest.Close()
	}
	junk := p.junk
	p.junk = nil
	if len(junk) > 0 {
		r, w, err := socketPair()
		if err != nil {
			return nil, err
		}
		raw := guest
		go func() { w.Write(junk); io.Copy(w, raw); w.Close() }()
		guest = &joined{Conn: raw, r: r}
	}
	p.guest = guest
	p.cond.Broadcast()
	p.mu.Unlock()
	return host, nil
}

// socketPair is a connected pair of unix stream sockets: buffered, as a
// chardev socket is, where net.Pipe is not.
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}

// joined reads r (junk, then the connection) and writes the connection.
type joined struct {
	net.Conn
	r net.Conn
}

func (j *joined) Read(b []byte) (int, error) { return j.r.Read(b) }

func (p *fakePort) current() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.guest
}

func (p *fakePort) Read(b []byte) (int, error) {
	c := p.current()
	if c == nil {
		return 0, nil
	}
	n, err := c.Read(b)
	if err != nil {
		p.drop(c)
		return n, nil
	}
	return n, nil
}

func (p *fakePort) Write(b []byte) (int, error) {
	p.mu.Lock()
	for p.guest == nil {
		p.cond.Wait()
	}
	c := p.guest
	p.mu.Unlock()
	n, err := c.Write(b)
	if err != nil {
		p.drop(c)
		// The port stays open: a write to a departed host is lost.
		return len(b), nil
	}
	return n, nil
}

func (p *fakePort) drop(c net.Conn) {
	p.mu.Lock()
	if p.guest == c {
		p.guest = nil
	}
	p.mu.Unlock()
}

// echo serves l's streams by copying each back.
func echo(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() { io.Copy(c, c); c.Close() }()
	}
}

func roundTrip(t *testing.T, d *Dialer, msg []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.Dial(ctx)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo differs")
	}
}

func listen(t *testing.T, p *fakePort) *Listener {
	l := Listen(p, slog.New(slog.NewTextHandler(io.Discard, nil)))
	t.Cleanup(func() { l.Close() })
	go echo(l)
	return l
}

// Streams of one session carry bytes exactly, many at a time.
func TestStreams(t *testing.T) {
	p := newFakePort()
	listen(t, p)
	d := NewDialer(p.connect)
	defer d.Close()
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := make([]byte, 300<<10)
			rand.Read(msg)
			roundTrip(t, d, msg)
		}()
	}
	wg.Wait()
}

// A new host connection (a restarted daemon's dialer) gets a working
// session although bytes of the old one were still queued both ways, and
// a hello the guest answers late to a connection given up is no session.
func TestReconnectSkipsStaleBytes(t *testing.T) {
	p := newFakePort()
	listen(t, p)
	d := NewDialer(p.connect)
	roundTrip(t, d, []byte("first"))
	d.Close()

	// Queued for the guest: half a yamux frame and a hello of a
	// connection that is gone, which the guest answers into the void
	// before it finds the new one.
	p.mu.Lock()
	p.junk = []byte("\x00\x01\x00\x02garbage" + helloPrefix + strings.Repeat("a", nonceLen) + "\n" + strings.Repeat("x", 1000))
	p.mu.Unlock()
	d2 := NewDialer(p.connect)
	defer d2.Close()
	for i := 0; i < 3; i++ {
		roundTrip(t, d2, []byte("second"))
	}
}

// A Dial whose caller gives up leaves the handshake running: the next Dial
// gets its session instead of starting over.
func TestDialBeforeGuestListens(t *testing.T) {
	p := newFakePort()
	var connects int
	var mu sync.Mutex
	d := NewDialer(func(ctx context.Context) (net.Conn, error) {
		mu.Lock()
		connects++
		mu.Unlock()
		return p.connect(ctx)
	})
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := d.Dial(ctx)
	cancel()
	if err == nil {
		t.Fatal("dial answered with no guest listening")
	}
	listen(t, p)
	roundTrip(t, d, []byte("late"))
	mu.Lock()
	defer mu.Unlock()
	if connects != 1 {
		t.Errorf("%d connects, want 1", connects)
	}
}

// A session the host end lost (the VM restarted under it) is replaced on
// the next Dial.
func TestDialAfterSessionEnds(t *testing.T) {
	p := newFakePort()
	listen(t, p)
	d := NewDialer(p.connect)
	defer d.Close()
	roundTrip(t, d, []byte("one"))
	p.mu.Lock()
	p.guest.Close()
	p.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		s := d.sess
		d.mu.Unlock()
		if s == nil || s.IsClosed() || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	roundTrip(t, d, []byte("two"))
}

// sharedHost is the host end of one socket that successive connects
// return, so the guest sees no hangup between them: a reconnect the guest
// kernel never noticed, as when a connection follows the last before the
// guest read again. Reads go through one pump; a closed conn stops
// reading without closing the socket.
type sharedHost struct {
	sock  net.Conn
	reads chan []byte
}

func newSharedHost(sock net.Conn) *sharedHost {
	h := &sharedHost{sock: sock, reads: make(chan []byte)}
	go func() {
		for {
			b := make([]byte, 4096)
			n, err := sock.Read(b)
			if err != nil {
				close(h.reads)
				return
			}
			h.reads <- b[:n]
		}
	}()
	return h
}

func (h *sharedHost) connect(context.Context) (net.Conn, error) {
	return &sharedConn{Conn: h.sock, h: h, closed: make(chan struct{})}, nil
}

type sharedConn struct {
	net.Conn
	h        *sharedHost
	buf      []byte
	closed   chan struct{}
	once     sync.Once
	mu       sync.Mutex
	deadline time.Time
}

// The socket's deadlines are the pump's: a conn keeps its own read
// deadline and sets none on the socket.
func (c *sharedConn) SetDeadline(t time.Time) error    { return c.SetReadDeadline(t) }
func (c *sharedConn) SetWriteDeadline(time.Time) error { return nil }
func (c *sharedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}

func (c *sharedConn) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		c.mu.Lock()
		d := c.deadline
		c.mu.Unlock()
		var timeout <-chan time.Time
		if !d.IsZero() {
			timeout = time.After(time.Until(d))
		}
		select {
		case <-timeout:
			return 0, os.ErrDeadlineExceeded
		case b, ok := <-c.h.reads:
			if !ok {
				return 0, io.EOF
			}
			c.buf = b
		case <-c.closed:
			return 0, io.EOF
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

func (c *sharedConn) Close() error { c.once.Do(func() { close(c.closed) }); return nil }

// A new connection's hello that reaches the guest inside the old session
// (it never saw the host go) is swallowed by it; the host says hello again
// and gets a session.
func TestReconnectUnnoticed(t *testing.T) {
	p := newFakePort()
	listen(t, p)
	sock, err := p.connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	h := newSharedHost(sock)
	d := NewDialer(h.connect)
	roundTrip(t, d, []byte("first"))
	d.Close()
	d2 := NewDialer(h.connect)
	defer d2.Close()
	roundTrip(t, d2, []byte("second"))
}

func TestDialAfterClose(t *testing.T) {
	d := NewDialer(newFakePort().connect)
	d.Close()
	if _, err := d.Dial(context.Background()); err != ErrClosed {
		t.Fatalf("dial after close: %v, want ErrClosed", err)
	}
}

func TestScanner(t *testing.T) {
	nonce := strings.Repeat("0123456789abcdef", 2)
	line := helloPrefix + nonce + "\n"
	for _, tc := range []struct {
		name   string
		pieces []string
		ok     bool
		rest   string
	}{
		{"whole", []string{line}, true, ""},
		{"byte by byte", strings.Split(line+"after", ""), true, ""},
		{"after junk", []string{"junk without newline", line + "rest"}, true, "rest"},
		{"after a long line", []string{strings.Repeat("y", 3*maxLine), line}, true, ""},
		{"upper-case nonce", []string{helloPrefix + strings.ToUpper(nonce) + "\n"}, false, ""},
		{"short nonce", []string{helloPrefix + nonce[1:] + "\n"}, false, ""},
		{"inside a line", []string{"x" + helloPrefix[1:] + nonce + "\n"}, false, ""},
		{"other prefix", []string{readyPrefix + nonce + "\n"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := scanner{prefixes: []string{helloPrefix}}
			for i, piece := range tc.pieces {
				got, rest, ok := s.feed([]byte(piece))
				if ok {
					if !tc.ok || got != nonce {
						t.Fatalf("found %q", got)
					}
					// The byte-by-byte case feeds "after" in later pieces.
					if i == len(tc.pieces)-1 && string(rest) != tc.rest {
						t.Fatalf("rest %q, want %q", rest, tc.rest)
					}
					return
				}
			}
			if tc.ok {
				t.Fatal("not found")
			}
		})
	}
}

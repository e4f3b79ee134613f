package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/hashicorp/yamux"
)

// rig is a tunnel server behind a real WebSocket endpoint, whose "sandbox"
// ports are loopback listeners of the test.
type rig struct {
	ports  map[uint16]string // tunnel port → address it dials
	cancel context.CancelFunc
	ended  chan error
}

// newRig serves tunnels at a test HTTP server; every session is bound to
// one context the test can cancel (a sandbox stopping).
func newRig(t testing.TB, ports map[uint16]string) (*rig, string) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{ports: ports, cancel: cancel, ended: make(chan error, 16)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		ws, err := websocket.Accept(w, req, nil)
		if err != nil {
			return
		}
		ws.SetReadLimit(MaxWindow + 64)
		conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
		r.ended <- Serve(ctx, conn, Config{
			Allowed: func(p uint16) bool { return p != 7 },
			Dial: func(ctx context.Context, p uint16) (net.Conn, error) {
				addr, ok := r.ports[p]
				if !ok {
					addr = "127.0.0.1:1" // nothing listens there
				}
				var d net.Dialer
				return d.DialContext(ctx, "tcp", addr)
			},
		})
	}))
	t.Cleanup(func() { cancel(); srv.Close() })
	return r, srv.URL
}

// session opens a yamux client session over a WebSocket to url, as the
// official clients do.
func session(t testing.TB, url string) *yamux.Session {
	ws, _, err := websocket.Dial(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(MaxWindow + 64)
	sess, err := yamux.Client(websocket.NetConn(context.Background(), ws, websocket.MessageBinary), SessionConfig(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sess.Close() })
	return sess
}

// connect opens a stream with the connect header (version v, port) and
// returns it with the daemon's status byte.
func connect(t testing.TB, sess *yamux.Session, v byte, port uint16) (*yamux.Stream, byte) {
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	hdr := []byte{v, 0, 0}
	binary.BigEndian.PutUint16(hdr[1:], port)
	if _, err := st.Write(hdr); err != nil {
		t.Fatal(err)
	}
	var status [1]byte
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(st, status[:]); err != nil {
		t.Fatalf("status: %v", err)
	}
	st.SetReadDeadline(time.Time{})
	return st, status[0]
}

// echoServer echoes every connection until the test ends; served counts
// connections whose peer closed (EOF reached the server).
func echoServer(t testing.TB) (addr string, closed chan struct{}) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	closed = make(chan struct{}, 1024)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(c, c)
				c.Close()
				closed <- struct{}{}
			}()
		}
	}()
	return ln.Addr().String(), closed
}

// TestParallelStreamsEcho: 20 streams of one session at once, each
// echoing 1 MiB of its own random bytes intact.
func TestParallelStreamsEcho(t *testing.T) {
	addr, _ := echoServer(t)
	_, url := newRig(t, map[uint16]string{9000: addr})
	sess := session(t, url)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, status := connect(t, sess, protocol.TunnelVersion, 9000)
			if status != protocol.TunnelOK {
				errs <- fmt.Errorf("stream %d: status %d", i, status)
				return
			}
			defer st.Close()
			want := make([]byte, 1<<20)
			rand.Read(want)
			go func() { st.Write(want); st.Close() }()
			got, err := io.ReadAll(st)
			if err != nil || !bytes.Equal(got, want) {
				errs <- fmt.Errorf("stream %d: %d bytes back of %d (%v)", i, len(got), len(want), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestLargeStreamByteExact: 100 MiB through one stream and back, hashed.
func TestLargeStreamByteExact(t *testing.T) {
	addr, _ := echoServer(t)
	_, url := newRig(t, map[uint16]string{9000: addr})
	st, status := connect(t, session(t, url), protocol.TunnelVersion, 9000)
	if status != protocol.TunnelOK {
		t.Fatalf("status %d", status)
	}
	const size = 100 << 20
	sent := sha256.New()
	go func() {
		buf := make([]byte, 1<<20)
		for range size / len(buf) {
			rand.Read(buf)
			sent.Write(buf)
			if _, err := st.Write(buf); err != nil {
				return
			}
		}
		st.Close() // half-close: the echo still answers
	}()
	got := sha256.New()
	n, err := io.Copy(got, st)
	if err != nil || n != size {
		t.Fatalf("read back %d bytes of %d: %v", n, size, err)
	}
	if !bytes.Equal(got.Sum(nil), sent.Sum(nil)) {
		t.Fatal("bytes differ after 100 MiB through the tunnel")
	}
}

// TestRefusals: each refusal has its status byte and connects nothing.
func TestRefusals(t *testing.T) {
	addr, _ := echoServer(t)
	_, url := newRig(t, map[uint16]string{9000: addr, 7: addr})
	sess := session(t, url)
	for _, c := range []struct {
		name    string
		version byte
		port    uint16
		want    byte
	}{
		{"port not allowed", protocol.TunnelVersion, 7, protocol.TunnelPortNotAllowed},
		{"port zero", protocol.TunnelVersion, 0, protocol.TunnelPortNotAllowed},
		{"nothing listening", protocol.TunnelVersion, 9001, protocol.TunnelDialFailed},
		{"unknown version", 2, 9000, protocol.TunnelUnsupportedVersion},
	} {
		st, status := connect(t, sess, c.version, c.port)
		if status != c.want {
			t.Errorf("%s: status %d, want %d", c.name, status, c.want)
		}
		st.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := st.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
			t.Errorf("%s: stream still open after refusal: %d, %v", c.name, n, err)
		}
	}
	// The session survives refusals.
	if _, status := connect(t, sess, protocol.TunnelVersion, 9000); status != protocol.TunnelOK {
		t.Fatalf("after refusals: status %d", status)
	}
}

// TestSandboxGoneEndsSession: when the session's context ends (the
// sandbox stopped), open streams end at both ends: the client reads EOF
// or an error and the connection inside the sandbox is closed.
func TestSandboxGoneEndsSession(t *testing.T) {
	addr, closed := echoServer(t)
	r, url := newRig(t, map[uint16]string{9000: addr})
	sess := session(t, url)
	st, status := connect(t, sess, protocol.TunnelVersion, 9000)
	if status != protocol.TunnelOK {
		t.Fatalf("status %d", status)
	}
	st.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(st, buf); err != nil {
		t.Fatal(err)
	}
	r.cancel()
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := st.Read(buf); err == nil || errors.Is(err, yamux.ErrTimeout) {
		t.Fatalf("stream still open after the sandbox went: %v", err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection inside the sandbox was not closed")
	}
	select {
	case err := <-r.ended:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
}

// TestHalfClose: a client that closes its writing side still gets the
// answer (request/response protocols rely on it).
func TestHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, _ := io.ReadAll(c) // until the client's half-close
		fmt.Fprintf(c, "got %d bytes", len(req))
	}()
	_, url := newRig(t, map[uint16]string{80: ln.Addr().String()})
	st, status := connect(t, session(t, url), protocol.TunnelVersion, 80)
	if status != protocol.TunnelOK {
		t.Fatalf("status %d", status)
	}
	st.Write([]byte("hello"))
	st.Close()
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(st)
	if string(got) != "got 5 bytes" {
		t.Fatalf("answer after half-close: %q, %v", got, err)
	}
}

// BenchmarkTunnel compares a stream through the tunnel with a direct TCP
// connection to the same echo server, both over loopback in one run:
// throughput of a 64 MiB echo and the median of 1-byte round trips, with
// the tunnel's ratios to the direct connection.
func BenchmarkTunnel(b *testing.B) {
	addr, _ := echoServer(b)
	_, url := newRig(b, map[uint16]string{9000: addr})
	sess := session(b, url)
	dial := map[string]func() net.Conn{
		"direct": func() net.Conn {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			return c
		},
		"tunnel": func() net.Conn {
			st, status := connect(b, sess, protocol.TunnelVersion, 9000)
			if status != protocol.TunnelOK {
				b.Fatalf("status %d", status)
			}
			return st
		},
	}
	const size = 64 << 20
	mbps, rtt := map[string]float64{}, map[string]time.Duration{}
	for b.Loop() {
		for _, name := range []string{"direct", "tunnel"} {
			c := dial[name]()
			t0 := time.Now()
			go func() {
				buf := make([]byte, 256<<10)
				for range size / len(buf) {
					c.Write(buf)
				}
			}()
			if _, err := io.CopyN(io.Discard, c, size); err != nil {
				b.Fatal(err)
			}
			mbps[name] = size / time.Since(t0).Seconds() / 1e6
			var ds []time.Duration
			one := []byte{1}
			for range 200 {
				t1 := time.Now()
				c.Write(one)
				if _, err := io.ReadFull(c, one); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t1))
			}
			slices.Sort(ds)
			rtt[name] = ds[len(ds)/2]
			c.Close()
		}
	}
	b.ReportMetric(mbps["direct"], "direct-MB/s")
	b.ReportMetric(mbps["tunnel"], "tunnel-MB/s")
	b.ReportMetric(float64(rtt["direct"].Microseconds()), "direct-rtt-µs")
	b.ReportMetric(float64(rtt["tunnel"].Microseconds()), "tunnel-rtt-µs")
	b.ReportMetric(float64(rtt["tunnel"]-rtt["direct"])/1e3, "added-rtt-µs")
	b.ReportMetric(0, "ns/op")
}

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestConnLimits: unauthenticated callers cannot exhaust the daemon's file
// descriptors. One address holds at most --max-conns-per-client
// connections (more get a 503), a connection that sends nothing or trickles
// its headers is closed after --http-header-timeout, an idle keep-alive one
// after --http-idle-timeout; and none of that cuts a wait_for_ready create,
// an upload slower than the header timeout or an exec stream longer than
// both timeouts.
func TestConnLimits(t *testing.T) {
	const (
		perClient = 16
		header    = 500 * time.Millisecond
		idle      = 2 * time.Second
	)
	// The daemon starts with a low soft RLIMIT_NOFILE (children inherit
	// ours once we set it) and must raise it to the hard limit.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = min(1024, lim.Max)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	d := startDaemonArgs(t, "gvisor", "", "--max-conns-per-client", fmt.Sprint(perClient),
		"--http-header-timeout", header.String(), "--http-idle-timeout", idle.String())
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	pid := d.cmd.Process.Pid

	t.Run("nofile soft limit raised to hard", func(t *testing.T) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
		if err != nil {
			t.Fatal(err)
		}
		var soft, hard uint64
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "Max open files"); ok {
				_, _ = fmt.Sscan(rest, &soft, &hard)
			}
		}
		// The Go runtime raises it to hard-1 (so that it can tell a later
		// prlimit from its own change).
		if hard == 0 || soft+1 < hard || low.Cur < lim.Max && soft <= low.Cur {
			t.Fatalf("daemon's open files limit: soft %d, hard %d (started at %d); want soft raised to the hard one", soft, hard, low.Cur)
		}
	})

	t.Run("per-client cap", func(t *testing.T) {
		// Addresses the harness's own clients do not use, so the counts are
		// exact.
		attacker, other := "127.0.0.3", "127.0.0.4"
		base := fdCount(t, pid)
		const n = 200
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		ok, refused := 0, 0
		for range n {
			c, status := rawGet(t, attacker, d.listen)
			switch status {
			case http.StatusOK:
				ok++
				held = append(held, c) // now idle on keep-alive
			case http.StatusServiceUnavailable:
				refused++
				c.Close()
			default:
				t.Fatalf("status %d", status)
			}
		}
		if ok != perClient || refused != n-perClient {
			t.Fatalf("%d connections from one address: %d served, %d refused; want %d served", n, ok, refused, perClient)
		}
		grown := fdCount(t, pid) - base
		t.Logf("%d connections from one address: %d served, %d refused; daemon fds %d → %d", n, ok, refused, base, base+grown)
		if grown > perClient+4 {
			t.Fatalf("daemon holds %d more fds after %d connections from one address (cap %d)", grown, n, perClient)
		}
		// Another client is served meanwhile.
		c, status := rawGet(t, other, d.listen)
		c.Close()
		if status != http.StatusOK {
			t.Fatalf("other client: status %d while one address holds its cap", status)
		}
		// Closing gives the slots back.
		for _, c := range held {
			c.Close()
		}
		held = nil
		deadline := time.Now().Add(2 * time.Second)
		for {
			c, status := rawGet(t, attacker, d.listen)
			c.Close()
			if status == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("address still refused (%d) after closing its connections", status)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	t.Run("silent connection closed after the header timeout", func(t *testing.T) {
		c := dialFromAddr(t, "127.0.0.5", d.listen)
		defer c.Close()
		start := time.Now()
		closedWithin(t, c, start, header, header+2*time.Second)
	})

	t.Run("slow-loris header closed after the header timeout", func(t *testing.T) {
		c := dialFromAddr(t, "127.0.0.5", d.listen)
		defer c.Close()
		start := time.Now()
		go func() {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n"); err != nil {
				return
			}
			for i := 0; ; i++ {
				time.Sleep(100 * time.Millisecond)
				if _, err := fmt.Fprintf(c, "X-Slow-%d: y\r\n", i); err != nil {
					return
				}
			}
		}()
		closedWithin(t, c, start, header, header+2*time.Second)
	})

	t.Run("idle keep-alive closed after the idle timeout", func(t *testing.T) {
		c, status := rawGet(t, "127.0.0.6", d.listen)
		defer c.Close()
		if status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		closedWithin(t, c, time.Now(), idle, idle+2*time.Second)
	})

	t.Run("long requests still work", func(t *testing.T) {
		start := time.Now()
		sn := readySnapshot(t, d.Client, "conns", testImage(t))
		wait := true
		sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) { r.WaitForReady = &wait })
		t.Logf("snapshot and wait_for_ready create took %v (header timeout %v)", time.Since(start), header)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// An upload whose body takes three header timeouts to arrive.
		if err := d.Client.WriteFile(ctx, sb.Name, "/tmp/slow", &slowReader{chunks: 6, every: header / 2}); err != nil {
			t.Fatalf("slow upload: %v", err)
		}
		if got := mustRun(t, d.Client, sb.Name, "wc -c < /tmp/slow"); strings.TrimSpace(got) != "6" {
			t.Fatalf("uploaded %q bytes, want 6", got)
		}
		// An exec stream (WebSocket) and a POST execute, each silent for
		// longer than both timeouts.
		silent := fmt.Sprintf("sleep %d; echo done", int((idle+time.Second)/time.Second))
		if out := mustRun(t, d.Client, sb.Name, silent); strings.TrimSpace(out) != "done" {
			t.Fatalf("exec stream: %q", out)
		}
		res, err := d.Client.Run(ctx, sb.Name, silent)
		if err != nil || strings.TrimSpace(res.Stdout) != "done" {
			t.Fatalf("POST execute: %+v, %v", res, err)
		}
	})
}

// dialFromAddr connects to addr from the local address src.
func dialFromAddr(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	dl := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := dl.Dial("tcp4", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	return c
}

// rawGet sends GET /healthz on a new keep-alive connection from src and
// returns the connection and the response status.
func rawGet(t *testing.T, src, addr string) (net.Conn, int) {
	t.Helper()
	c := dialFromAddr(t, src, addr)
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatalf("write request: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode
}

// closedWithin requires the server to close c between min and max after
// start (reading until EOF or a reset).
func closedWithin(t *testing.T, c net.Conn, start time.Time, min, max time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(start.Add(max + time.Second))
	buf := make([]byte, 512)
	for {
		_, err := c.Read(buf)
		if err == nil {
			continue // e.g. a 408 before the close
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection still open after %v", time.Since(start))
		}
		break
	}
	if took := time.Since(start); took < min-100*time.Millisecond || took > max {
		t.Fatalf("server closed the connection after %v, want between %v and %v", took, min, max)
	}
}

// fdCount is the number of open file descriptors of process pid.
func fdCount(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// slowReader yields one byte per chunk, every apart.
type slowReader struct {
	chunks int
	every  time.Duration
}

func (r *slowReader) Read(p []byte) (int, error) {
	if r.chunks == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.every)
	r.chunks--
	p[0] = 'x'
	return 1, nil
}

// TestEgressConnCap: a sandbox cannot exhaust the daemon's file
// descriptors through the egress proxy either: it holds at most
// --egress-max-conns-per-sandbox connections through it at once, and more
// are reset; once it lets go, it is served again.
func TestEgressConnCap(t *testing.T) {
	const perSandbox, tries = 8, 40
	in := newInternet(t)
	d := startDaemonArgs(t, "gvisor", "", "--egress-max-conns-per-sandbox", fmt.Sprint(perSandbox),
		"--egress-resolve", "allowed.test="+in.addr(0))
	sn := readySnapshot(t, d.Client, "egcap", testImage(t))
	sb := newSandbox(t, d.Client, sn.ID, func(r *protocol.CreateSandboxRequest) {
		r.ProxyConfig = json.RawMessage(`{"access_control":{"allow_list":["allowed.test"]}}`)
	})
	pid := d.cmd.Process.Pid
	base := fdCount(t, pid)
	// Each nc holds a redirected connection to the proxy, sending nothing
	// for 3 s.
	mustRun(t, d.Client, sb.Name, fmt.Sprintf("for i in $(seq %d); do (sleep 3 | nc %s 80 >/dev/null 2>&1 &); done; sleep 1", tries, in.addr(0)))
	grown := fdCount(t, pid) - base
	t.Logf("%d held connections from one sandbox: daemon fds %d → %d (cap %d)", tries, base, base+grown, perSandbox)
	if grown > perSandbox+4 || grown < perSandbox/2 {
		t.Fatalf("daemon fds grew by %d for %d held connections, want about the cap %d", grown, tries, perSandbox)
	}
	// stdin stays open until the answer is in: busybox nc half-closes at
	// stdin's EOF, which Go's HTTP server (the proxy) takes for a client
	// gone away, cancelling the upstream request (see README, egress).
	request := fmt.Sprintf(`(printf 'GET / HTTP/1.0\r\nHost: allowed.test\r\n\r\n'; sleep 2) | nc -w 5 %s 80`, in.addr(0))
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, _ := run(t, d.Client, sb.Name, request)
		if strings.Contains(out, "host=allowed.test") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox not served after its held connections ended: %q", out)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

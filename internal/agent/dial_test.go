package agent

import (
	"context"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDialAgentRetriesSlowConnect: a connect that times out (here: the
// listener's accept queue is full, so the kernel drops the SYN, as a
// Sentry starved of CPU is slow to answer it) is tried again with a longer
// wait instead of failing after dialTimeout; a refused one fails at once.
func TestDialAgentRetriesSlowConnect(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil { // an accept queue of one
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*unix.SockaddrInet4).Port}).String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var fill []net.Conn // occupy the queue: later SYNs are dropped
	defer func() {
		for _, c := range fill {
			c.Close()
		}
	}()
	for range 2 {
		c, err := (&net.Dialer{Timeout: 200 * time.Millisecond}).DialContext(ctx, "tcp", addr)
		if err != nil {
			break
		}
		fill = append(fill, c)
	}
	if _, err := (&net.Dialer{Timeout: dialTimeout}).DialContext(ctx, "tcp", addr); err == nil {
		t.Skip("the kernel did not drop a SYN for a full accept queue: nothing to retry")
	}
	// Free the queue after the first try's wait has run out.
	go func() {
		time.Sleep(dialTimeout + 200*time.Millisecond)
		for range fill {
			if nfd, _, err := unix.Accept(fd); err == nil {
				unix.Close(nfd)
			}
		}
	}()
	t0 := time.Now()
	c, err := dialAgent(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial after %v: %v", time.Since(t0), err)
	}
	c.Close()
	if took := time.Since(t0); took < dialTimeout {
		t.Fatalf("connected after %v, before the first wait ran out: the test did not exercise a retry", took)
	}

	// Refused: no retries.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	t0 = time.Now()
	if _, err := dialAgent(ctx, "tcp", closed); err == nil || time.Since(t0) > 100*time.Millisecond {
		t.Fatalf("refused connect: %v after %v", err, time.Since(t0))
	}
}

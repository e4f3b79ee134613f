package api

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLimitListener: a client over its cap gets the protocol's 503 and
// the connection closes; closing one of its connections frees a slot.
func TestLimitListener(t *testing.T) {
	raw, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := LimitListener(raw, 2, slog.New(slog.DiscardHandler))
	srv := NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnLimits{HeaderTimeout: time.Minute, IdleTimeout: time.Minute}, slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	get := func() (net.Conn, *http.Response, string) {
		t.Helper()
		c, err := net.Dial("tcp4", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		return c, resp, string(b)
	}
	a, _, _ := get()
	b, _, _ := get()
	c, resp, body := get()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"error":"TooManyConnections"`) || !resp.Close {
		t.Fatalf("third connection: %d %q close=%v; want the protocol's 503 and a close", resp.StatusCode, body, resp.Close)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("over-cap connection left open")
	}
	c.Close()
	b.Close()
	deadline := time.Now().Add(2 * time.Second)
	for {
		d, resp, _ := get()
		d.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("closing a connection did not free its slot")
		}
		time.Sleep(20 * time.Millisecond)
	}
	a.Close()
}

package connlimit

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestListen: past the cap, connections go to refuse; closing one frees
// its slot.
func TestListen(t *testing.T) {
	raw, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{}, 8)
	ln := Listen(raw, 2, func(c *net.TCPConn) { c.Close(); refused <- struct{}{} })
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp4", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	expect := func(ch <-chan net.Conn, want string) net.Conn {
		t.Helper()
		select {
		case c := <-ch:
			return c
		case <-refused:
			if want == "accepted" {
				t.Fatal("refused within the cap")
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("neither accepted nor refused, want %s", want)
		}
		return nil
	}
	dial()
	dial()
	first := expect(accepted, "accepted")
	expect(accepted, "accepted")
	dial()
	select {
	case <-refused:
	case <-accepted:
		t.Fatal("third connection accepted over a cap of 2")
	case <-time.After(2 * time.Second):
		t.Fatal("third connection not refused")
	}
	first.Close()
	first.Close() // idempotent: frees one slot only
	dial()
	expect(accepted, "accepted")
	dial()
	select {
	case <-refused:
	case <-accepted:
		t.Fatal("a double Close freed two slots")
	case <-time.After(2 * time.Second):
		t.Fatal("connection over the cap not refused")
	}
}

// TestClient: an IPv6 host cannot escape its cap by rotating addresses
// within its /64; IPv4-mapped addresses count as IPv4.
func TestClient(t *testing.T) {
	k := func(s string) netip.Prefix { return Client(netip.MustParseAddr(s)) }
	if k("2001:db8::1") != k("2001:db8::ffff:1") {
		t.Error("two addresses of one /64 have different keys")
	}
	if k("2001:db8::1") == k("2001:db8:0:1::1") {
		t.Error("two /64s share a key")
	}
	if k("::ffff:192.0.2.1") != k("192.0.2.1") || k("192.0.2.1") == k("192.0.2.2") {
		t.Error("IPv4 keys are not per address")
	}
}

package network

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// secondAddr gives the outside namespace one more address (on its lo,
// routed from the host via o.ip), so a test can allow one and deny the other.
func (o *outside) secondAddr(t *testing.T) netip.Addr {
	t.Helper()
	b := o.ip.As4()
	a := netip.AddrFrom4([4]byte{198, 19, b[2], 5})
	h, err := netns.GetFromPath(o.ns)
	must(t, err)
	defer h.Close()
	in, err := netlink.NewHandleAt(h)
	must(t, err)
	defer in.Close()
	lo, _ := in.LinkByName("lo")
	must(t, in.AddrAdd(lo, addr(a, 32)))
	r := &netlink.Route{Dst: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}, Gw: o.ip.AsSlice()}
	must(t, netlink.RouteAdd(r))
	t.Cleanup(func() { _ = netlink.RouteDel(r) })
	return a
}

// refusedFast dials addr from the sandbox and requires a quick refusal
// (TCP reset or ICMP reject), not a silent drop.
func refusedFast(t *testing.T, nsPath, addr string) {
	t.Helper()
	start := time.Now()
	c, err := dialFrom(t, nsPath, addr)
	if err == nil {
		c.Close()
		t.Fatalf("reached %s, want refused", addr)
	}
	if took := time.Since(start); took > 300*time.Millisecond || !strings.Contains(err.Error(), "refused") && !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("dial %s: %v after %v, want a fast refusal", addr, err, took)
	}
}

func TestEgressPolicy(t *testing.T) {
	env := newEnv(t)
	m := env.manager(t)
	ctx := context.Background()
	out := newOutside(t, env.netnsDir)
	second := out.secondAddr(t)
	listenIn(t, out.ns, "0.0.0.0:7000")

	id := randID(t, "eg")
	ep, err := m.Setup(ctx, id)
	must(t, err)
	first := netip.AddrPortFrom(out.ip, 7000).String()
	other := netip.AddrPortFrom(second, 7000).String()
	mustReach(t, ep.NetNS, first)
	mustReach(t, ep.NetNS, other)

	t.Run("deny", func(t *testing.T) {
		must(t, m.SetEgress(id, EgressPolicy{Mode: EgressDeny, Nets: []netip.Prefix{netip.PrefixFrom(second, 32)}}))
		mustReach(t, ep.NetNS, first)
		refusedFast(t, ep.NetNS, other)
		if n, err := m.EgressRejected(id); err != nil || n == 0 {
			t.Fatalf("rejected counter = %d, %v; want > 0", n, err)
		}
	})
	t.Run("allow replaces deny", func(t *testing.T) {
		must(t, m.SetEgress(id, EgressPolicy{Mode: EgressAllow, Nets: []netip.Prefix{
			netip.PrefixFrom(out.ip, 30).Masked(), netip.PrefixFrom(out.ip, 32), // overlapping on purpose
		}}))
		mustReach(t, ep.NetNS, first)
		refusedFast(t, ep.NetNS, other)
	})
	t.Run("allow: port 53 goes to the daemon's resolver or nowhere", func(t *testing.T) {
		// Both outside addresses serve port 53 (TCP and UDP), as any host
		// on the internet may.
		listenIn(t, out.ns, "0.0.0.0:53")
		outsideUDP := udpEchoIn(t, out.ns, "0.0.0.0:53")
		toOutside := []string{netip.AddrPortFrom(out.ip, 53).String(), netip.AddrPortFrom(second, 53).String()}

		// Without a resolver port, DNS is outside the list like the rest.
		must(t, m.SetEgress(id, EgressPolicy{Mode: EgressAllow}))
		for _, dst := range toOutside {
			refusedFast(t, ep.NetNS, dst)
			if reply, err := udpRoundTrip(t, ep.NetNS, dst); err == nil {
				t.Fatalf("UDP to %s answered %q", dst, reply)
			}
		}

		// With one, every port-53 flow, whatever its address, ends at the
		// daemon's resolver port on the host.
		udpPort, tcpPort := hostResolver(t)
		if udpPort != tcpPort {
			t.Fatalf("resolver ports %d/%d differ", udpPort, tcpPort)
		}
		must(t, m.SetEgress(id, EgressPolicy{Mode: EgressAllow, DNSPort: udpPort}))
		for _, dst := range toOutside {
			if got := mustReach(t, ep.NetNS, dst); got != "resolver "+ep.SandboxIP.String() {
				t.Fatalf("TCP to %s reached %q, want the daemon's resolver", dst, got)
			}
			reply, err := udpRoundTrip(t, ep.NetNS, dst)
			if err != nil || reply != "resolver ping" {
				t.Fatalf("UDP to %s: %q, %v; want the daemon's resolver", dst, reply, err)
			}
		}
		if n := outsideUDP.Load(); n != 0 {
			t.Fatalf("%d datagrams reached port 53 outside", n)
		}
		// The resolver port itself is not reachable directly.
		mustNotReach(t, ep.NetNS, netip.AddrPortFrom(ep.HostIP, udpPort).String(), "resolver port dialled directly")
		if reply, err := udpRoundTrip(t, ep.NetNS, netip.AddrPortFrom(ep.HostIP, udpPort).String()); err == nil {
			t.Fatalf("resolver port reached directly over UDP: %q", reply)
		}
	})
	t.Run("open", func(t *testing.T) {
		must(t, m.SetEgress(id, EgressPolicy{}))
		mustReach(t, ep.NetNS, other)
	})
	t.Run("redirect to proxy", func(t *testing.T) {
		ln, err := net.Listen("tcp4", "0.0.0.0:0")
		must(t, err)
		defer ln.Close()
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		got := make(chan string, 4)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				od, err := OriginalDst(c.(*net.TCPConn))
				got <- fmt.Sprintf("%v %v", od, err)
				c.Close()
			}
		}()
		must(t, m.SetEgress(id, EgressPolicy{Mode: EgressAllow, ProxyPort: port}))
		for _, dst := range []string{netip.AddrPortFrom(second, 80).String(), netip.AddrPortFrom(out.ip, 443).String()} {
			c, err := dialFromWithin(t, ep.NetNS, dst, reachTimeout)
			if err != nil {
				t.Fatalf("dial %s: %v", dst, err)
			}
			c.Close()
			if s := <-got; s != dst+" <nil>" {
				t.Fatalf("proxy saw original destination %q, want %s", s, dst)
			}
		}
		// The proxy port itself is not reachable directly, and other
		// ports stay under the list.
		mustNotReach(t, ep.NetNS, netip.AddrPortFrom(ep.HostIP, port).String(), "proxy port dialled directly")
		refusedFast(t, ep.NetNS, other)
		// Dropping the redirect sends 80 back to the packet policy.
		must(t, m.SetEgress(id, EgressPolicy{Mode: EgressDeny, Nets: []netip.Prefix{netip.PrefixFrom(second, 32)}}))
		_, err = dialFrom(t, ep.NetNS, netip.AddrPortFrom(second, 80).String())
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Fatalf("after removing the redirect, dial to denied :80 = %v, want refused", err)
		}
	})

	must(t, m.Teardown(ctx, id))
	// Other tests on this host may add links and rules meanwhile: check
	// this sandbox's own pieces only.
	if _, err := netlink.LinkByName(ep.HostIf); err == nil {
		t.Fatalf("%s survives teardown", ep.HostIf)
	}
	conn, err := nftables.New()
	must(t, err)
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyINet)
	must(t, err)
	for _, c := range chains {
		if c.Name == egressChain(ep.HostIf) {
			t.Fatalf("chain %s survives teardown", c.Name)
		}
	}
	for _, s := range egressSets(inetTable()) {
		elems, err := conn.GetSetElements(s)
		must(t, err)
		for _, e := range elems {
			if ip := ep.SandboxIP.As4(); len(e.Key) >= 4 && [4]byte(e.Key[:4]) == ip {
				t.Fatalf("%s keeps an element for %s", s.Name, ep.SandboxIP)
			}
		}
	}
	if n, _ := m.EgressRejected(id); n != 0 {
		t.Fatalf("counter survives teardown: %d", n)
	}
}

// udpEchoIn serves UDP echo on addr inside nsPath and counts the
// datagrams it receives.
func udpEchoIn(t *testing.T, nsPath, addr string) *atomic.Int64 {
	t.Helper()
	var pc net.PacketConn
	var err error
	inNS(t, nsPath, func() { pc, err = net.ListenPacket("udp4", addr) })
	if err != nil {
		t.Fatalf("listen udp in %s on %s: %v", nsPath, addr, err)
	}
	var n atomic.Int64
	serveUDP(t, pc, "", &n)
	return &n
}

// serveUDP answers each datagram on pc with prefix and its payload.
func serveUDP(t *testing.T, pc net.PacketConn, prefix string, n *atomic.Int64) {
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = pc.WriteTo(append([]byte(prefix), buf[:k]...), from)
		}
	}()
}

// hostResolver plays the daemon's resolver: UDP and TCP on one port of
// the host, answering "resolver ..." (UDP: the payload; TCP: the peer).
func hostResolver(t *testing.T) (udpPort, tcpPort uint16) {
	t.Helper()
	// As the daemon does: a free UDP port may be taken for TCP, so try
	// another.
	var (
		pc   net.PacketConn
		ln   net.Listener
		port int
		err  error
	)
	for range 10 {
		pc, err = net.ListenPacket("udp4", "0.0.0.0:0")
		must(t, err)
		port = pc.LocalAddr().(*net.UDPAddr).Port
		if ln, err = net.Listen("tcp4", fmt.Sprintf("0.0.0.0:%d", port)); err == nil {
			break
		}
		pc.Close()
	}
	must(t, err)
	var n atomic.Int64
	serveUDP(t, pc, "resolver ", &n)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "resolver %s\n", c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
	return uint16(port), uint16(ln.Addr().(*net.TCPAddr).Port)
}

// udpRoundTrip sends "ping" to addr from nsPath and waits briefly for an
// answer.
func udpRoundTrip(t *testing.T, nsPath, addr string) (string, error) {
	var c net.Conn
	var err error
	inNS(t, nsPath, func() { c, err = net.Dial("udp4", addr) })
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	buf := make([]byte, 64)
	k, err := c.Read(buf)
	if err != nil {
		return "", err
	}
	return string(buf[:k]), nil
}

func TestIntervalElems(t *testing.T) {
	p := netip.MustParsePrefix
	el, err := intervalElems([]netip.Prefix{p("10.0.0.0/24"), p("10.0.1.0/24"), p("10.0.0.5/32"), p("192.168.0.0/16"), p("255.255.255.255/32")})
	must(t, err)
	var got []string
	for _, e := range el {
		s := netip.AddrFrom4([4]byte(e.Key)).String()
		if e.IntervalEnd {
			s = "-" + s
		}
		got = append(got, s)
	}
	want := "10.0.0.0 -10.0.2.0 192.168.0.0 -192.169.0.0 255.255.255.255"
	if strings.Join(got, " ") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
}

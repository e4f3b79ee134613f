package proxy

import (
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeUpstream is a resolver on 127.0.0.1 (UDP and TCP) answering every A
// question with 192.0.2.1 after delay, counting the queries it gets.
func fakeUpstream(t *testing.T, delay time.Duration) (string, *atomic.Int64) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		n.Add(1)
		time.Sleep(delay)
		m := new(dns.Msg).SetReply(q)
		m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)})
		_ = w.WriteMsg(m)
	})
	for _, srv := range []*dns.Server{{PacketConn: pc, Handler: h}, {Listener: ln, Handler: h}} {
		go srv.ActivateAndServe()
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return pc.LocalAddr().String(), &n
}

// dnsService is a Service with only its resolver running, for a sandbox
// at 127.0.0.1 under policy raw.
func dnsService(t *testing.T, upstream, raw string) (*Service, *sandbox) {
	t.Helper()
	pol, err := Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{Upstreams: []string{upstream}, Resolve: map[string]netip.Addr{"pinned.test": netip.MustParseAddr("198.51.100.7")}},
		log: slog.New(slog.DiscardHandler), byIP: map[netip.Addr]*sandbox{}, byID: map[string]*sandbox{}}
	sb := &sandbox{id: "sb", ip: netip.MustParseAddr("127.0.0.1"), dnsSlots: make(chan struct{}, dnsInflight)}
	sb.policy.Store(pol)
	s.byIP[sb.ip], s.byID[sb.id] = sb, sb
	if s.dns, err = s.startDNS("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.dns.close)
	return s, sb
}

func query(t *testing.T, network, server, name string, from net.IP) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 3 * time.Second}
	if from != nil {
		c.Dialer = &net.Dialer{LocalAddr: &net.UDPAddr{IP: from}, Timeout: 3 * time.Second}
	}
	r, _, err := c.Exchange(new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA), server)
	if err != nil {
		t.Fatalf("query %s over %s: %v", name, network, err)
	}
	return r
}

// TestResolverPolicy: allowed names are forwarded (UDP and TCP), names
// outside the allow list get NXDOMAIN and never reach the upstream, pinned
// names answer as the proxy dials them, and a source that is no sandbox is
// refused (this is no open resolver).
func TestResolverPolicy(t *testing.T) {
	up, seen := fakeUpstream(t, 0)
	s, sb := dnsService(t, up, `{"access_control":{"allow_list":["allowed.test","pinned.test"]}}`)
	server := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(s.dns.port)))
	for _, network := range []string{"udp", "tcp"} {
		r := query(t, network, server, "Allowed.Test", nil)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "192.0.2.1" {
			t.Fatalf("allowed name over %s: %v", network, r)
		}
	}
	if seen.Load() != 2 {
		t.Fatalf("upstream saw %d queries, want 2", seen.Load())
	}
	if r := query(t, "udp", server, "data.exfil.test", nil); r.Rcode != dns.RcodeNameError {
		t.Fatalf("name outside the list: %v", r)
	}
	if r := query(t, "udp", server, "pinned.test", nil); len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != "198.51.100.7" {
		t.Fatalf("pinned name: %v", r)
	}
	if seen.Load() != 2 {
		t.Fatalf("upstream saw %d queries, want still 2", seen.Load())
	}
	if r := query(t, "udp", server, "allowed.test", net.IPv4(127, 0, 0, 2)); r.Rcode != dns.RcodeRefused {
		t.Fatalf("query from no sandbox: %v", r)
	}
	// A query is logged after its answer is sent, so the log may lag
	// its last query and hold the TCP one after later UDP ones.
	d := sb.dns.report()
	for deadline := time.Now().Add(2 * time.Second); len(d.Events) < 4 && time.Now().Before(deadline); d = sb.dns.report() {
		time.Sleep(5 * time.Millisecond)
	}
	denied := slices.IndexFunc(d.Events, func(e Event) bool { return !e.Allowed })
	if d.Allowed != 3 || d.Denied != 1 || len(d.Events) != 4 || denied < 0 || d.Events[denied].Host != "data.exfil.test" {
		t.Fatalf("DNS log: %+v", d)
	}
}

// TestResolverInflightCap: a sandbox flooding the resolver holds at most
// dnsInflight upstream exchanges (each a socket of the daemon); the rest
// fail at once.
func TestResolverInflightCap(t *testing.T) {
	up, seen := fakeUpstream(t, time.Second)
	s, _ := dnsService(t, up, `{}`)
	server := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(s.dns.port)))
	const n = dnsInflight + 16
	var wg sync.WaitGroup
	var failedFast atomic.Int64
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			r := query(t, "udp", server, "q"+strconv.Itoa(i)+".test", nil)
			if r.Rcode == dns.RcodeServerFailure && time.Since(start) < 500*time.Millisecond {
				failedFast.Add(1)
			}
		}()
	}
	wg.Wait()
	if got := seen.Load(); got > dnsInflight {
		t.Fatalf("upstream saw %d concurrent queries, cap %d", got, dnsInflight)
	}
	if failedFast.Load() < n-dnsInflight {
		t.Fatalf("%d of %d queries failed fast, want at least %d", failedFast.Load(), n, n-dnsInflight)
	}
}

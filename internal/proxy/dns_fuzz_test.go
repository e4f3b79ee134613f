package proxy

import (
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

// fuzzWriter is a dns.ResponseWriter that keeps what the handler writes.
type fuzzWriter struct {
	remote net.Addr
	msgs   []*dns.Msg
}

func (w *fuzzWriter) LocalAddr() net.Addr         { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53} }
func (w *fuzzWriter) RemoteAddr() net.Addr        { return w.remote }
func (w *fuzzWriter) WriteMsg(m *dns.Msg) error   { w.msgs = append(w.msgs, m); return nil }
func (w *fuzzWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *fuzzWriter) Close() error                { return nil }
func (w *fuzzWriter) TsigStatus() error           { return nil }
func (w *fuzzWriter) TsigTimersOnly(bool)         {}
func (w *fuzzWriter) Hijack()                     {}

// FuzzServeDNS feeds arbitrary DNS packets, as the server decodes them, to
// the sandbox resolver. There is no upstream, so nothing can leave. For
// every query exactly one answer is written, it packs, it carries the
// query's ID, and its code follows the policy: REFUSED for a source that is
// no sandbox, NOTIMP for anything but one question, NXDOMAIN for a name
// the policy refuses (never forwarded), the pinned address for a pinned
// name, SERVFAIL otherwise. The sandbox's DNS log stays bounded.
func FuzzServeDNS(f *testing.F) {
	pol, err := Parse([]byte(`{"access_control":{"allow_list":["*.allowed.test","pinned.test"]}}`))
	if err != nil {
		f.Fatal(err)
	}
	pinned := netip.MustParseAddr("198.51.100.7")
	s := &Service{cfg: Config{Resolve: map[string]netip.Addr{"pinned.test": pinned}},
		log: slog.New(slog.DiscardHandler), byIP: map[netip.Addr]*sandbox{}, byID: map[string]*sandbox{}}
	sb := &sandbox{id: "sb", ip: netip.MustParseAddr("127.0.0.1"), dnsSlots: make(chan struct{}, dnsInflight)}
	sb.policy.Store(pol)
	s.byIP[sb.ip], s.byID[sb.id] = sb, sb

	for _, q := range []*dns.Msg{
		new(dns.Msg).SetQuestion("pinned.test.", dns.TypeA),
		new(dns.Msg).SetQuestion("PINNED.test.", dns.TypeAAAA),
		new(dns.Msg).SetQuestion("x.allowed.test.", dns.TypeTXT),
		new(dns.Msg).SetQuestion("secret-data.attacker.example.", dns.TypeA),
		new(dns.Msg).SetQuestion("10.0.0.1.", dns.TypeA),
		{MsgHdr: dns.MsgHdr{Id: 7, Opcode: dns.OpcodeUpdate}},
		{MsgHdr: dns.MsgHdr{Id: 8}, Question: []dns.Question{{Name: "a.", Qtype: 1, Qclass: 1}, {Name: "b.", Qtype: 1, Qclass: 1}}},
	} {
		b, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
	}
	f.Fuzz(func(t *testing.T, packet []byte, fromSandbox bool) {
		q := new(dns.Msg)
		if q.Unpack(packet) != nil {
			return // the server drops what does not decode
		}
		remote := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5353}
		if !fromSandbox {
			remote.IP = net.IPv4(127, 0, 0, 2)
		}
		w := &fuzzWriter{remote: remote}
		s.ServeDNS(w, q)
		if len(w.msgs) != 1 {
			t.Fatalf("%d answers written, want 1", len(w.msgs))
		}
		m := w.msgs[0]
		if _, err := m.Pack(); err != nil {
			t.Fatalf("answer does not pack: %v", err)
		}
		if m.Id != q.Id || !m.Response {
			t.Fatalf("answer id %d response %v for query %d", m.Id, m.Response, q.Id)
		}
		want := dns.RcodeServerFailure
		switch {
		case !fromSandbox:
			want = dns.RcodeRefused
		case q.Opcode != dns.OpcodeQuery || len(q.Question) != 1:
			want = dns.RcodeNotImplemented
		case !pol.CheckHost(normHost(q.Question[0].Name)).Allowed:
			want = dns.RcodeNameError
		case normHost(q.Question[0].Name) == "pinned.test":
			want = dns.RcodeSuccess
			for _, rr := range m.Answer {
				if a, ok := rr.(*dns.A); !ok || !a.A.Equal(pinned.AsSlice()) {
					t.Fatalf("pinned name answered %v", rr)
				}
			}
		}
		if m.Rcode != want {
			t.Fatalf("query %v answered %s, want %s", q.Question, dns.RcodeToString[m.Rcode], dns.RcodeToString[want])
		}
		if r := sb.dns.report(); len(r.Events) > maxEvents {
			t.Fatalf("DNS log holds %d events, bound %d", len(r.Events), maxEvents)
		}
	})
}

package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/connlimit"
)

// The daemon's resolver serves every sandbox: internal/network
// redirects their UDP and TCP port 53, whatever the address, to it, so no
// DNS packet of theirs leaves the host. It applies the sandbox's
// access_control to the queried name before anything is forwarded: a name
// the policy refuses gets NXDOMAIN and never reaches an upstream, so DNS is
// no tunnel past an allow list (a query for <data>.attacker.example would
// otherwise travel to the attacker's nameserver through any recursive
// resolver). Other queries go to the host's resolvers. Names the proxy
// resolves itself (Config.Resolve) get the same answer here, so what a
// sandbox resolves is where the proxy connects. Each query is recorded in
// the sandbox's bounded DNS log.
const (
	dnsTimeout  = 5 * time.Second // one upstream exchange
	dnsInflight = 64              // forwarded queries in flight per sandbox
	dnsTCPConns = 32              // TCP connections per sandbox
)

// resolver is the running DNS server: UDP and TCP on one port.
type resolver struct {
	udp, tcp *dns.Server
	port     uint16
}

// startDNS listens on listen (host:port; port 0 picks one free for both
// UDP and TCP) and serves s.ServeDNS.
func (s *Service) startDNS(listen string) (*resolver, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("proxy: DNS listen address %q: %w", listen, err)
	}
	var errs []error
	for range 10 { // an ephemeral UDP port may be taken for TCP
		pc, err := net.ListenPacket("udp4", net.JoinHostPort(host, port))
		if err != nil {
			return nil, fmt.Errorf("proxy: DNS listen on udp %s: %w", listen, err)
		}
		p := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp4", net.JoinHostPort(host, fmt.Sprint(p)))
		if err != nil {
			pc.Close()
			errs = append(errs, err)
			if port != "0" {
				break
			}
			continue
		}
		r := &resolver{port: uint16(p),
			udp: &dns.Server{PacketConn: pc, Handler: s},
			tcp: &dns.Server{Listener: connlimit.Listen(ln, dnsTCPConns, func(c *net.TCPConn) { reset(c) }), Handler: s},
		}
		go s.runDNS(r.udp)
		go s.runDNS(r.tcp)
		return r, nil
	}
	return nil, fmt.Errorf("proxy: DNS listen on tcp %s: %w", listen, errors.Join(errs...))
}

func (s *Service) runDNS(srv *dns.Server) {
	if err := srv.ActivateAndServe(); err != nil {
		s.log.Warn("egress resolver stopped", "err", err)
		s.stopped("resolver: " + err.Error())
	}
}

func (r *resolver) close() {
	_ = r.udp.Shutdown()
	_ = r.tcp.Shutdown()
}

// ServeDNS answers one query of a sandbox (implements dns.Handler).
func (s *Service) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	peer, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	sb := s.bySource(peer.Addr().Unmap())
	if sb == nil {
		// Not a redirected sandbox: this is no open resolver.
		s.writeDNS(w, new(dns.Msg).SetRcode(q, dns.RcodeRefused))
		return
	}
	if q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
		s.writeDNS(w, new(dns.Msg).SetRcode(q, dns.RcodeNotImplemented))
		return
	}
	question := q.Question[0]
	name := normHost(question.Name)
	ev := Event{Time: time.Now().UTC(), Kind: "dns", Host: name, Type: dns.TypeToString[question.Qtype]}
	aw := &answerWriter{ResponseWriter: w}
	w = aw
	defer func() { sb.dns.add(ev, false); s.recordDNS(sb, ev, aw.msg) }()
	v := sb.policy.Load().CheckHost(name)
	ev.Allowed, ev.Reason = v.Allowed, v.Reason
	if !v.Allowed {
		s.writeDNS(w, new(dns.Msg).SetRcode(q, dns.RcodeNameError))
		return
	}
	if a, ok := s.cfg.Resolve[name]; ok {
		m := new(dns.Msg).SetReply(q)
		if question.Qtype == dns.TypeA && question.Qclass == dns.ClassINET {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a.AsSlice()})
		}
		s.writeDNS(w, m)
		return
	}
	select {
	case sb.dnsSlots <- struct{}{}:
		defer func() { <-sb.dnsSlots }()
	default:
		ev.Allowed, ev.Reason = false, fmt.Sprintf("more than %d queries in flight", dnsInflight)
		s.writeDNS(w, new(dns.Msg).SetRcode(q, dns.RcodeServerFailure))
		return
	}
	resp, err := s.forwardDNS(w.LocalAddr().Network(), q)
	if err != nil {
		ev.Allowed, ev.Reason = false, err.Error()
		resp = new(dns.Msg).SetRcode(q, dns.RcodeServerFailure)
	}
	s.writeDNS(w, resp)
}

// forwardDNS asks the upstreams in turn over network (udp or tcp, as the
// sandbox asked, so a truncated UDP answer makes it retry over TCP).
func (s *Service) forwardDNS(network string, q *dns.Msg) (*dns.Msg, error) {
	c := &dns.Client{Net: network, Timeout: dnsTimeout}
	var errs []error
	for _, up := range s.cfg.Upstreams {
		ctx, cancel := context.WithTimeout(context.Background(), dnsTimeout)
		resp, _, err := c.ExchangeContext(ctx, q, up)
		cancel()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("upstream %s: %w", up, err))
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstream resolver configured")
	}
	return nil, errors.Join(errs...)
}

func (s *Service) writeDNS(w dns.ResponseWriter, m *dns.Msg) {
	if err := w.WriteMsg(m); err != nil {
		s.log.Debug("egress resolver write", "err", err)
	}
}

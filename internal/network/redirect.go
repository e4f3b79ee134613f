package network

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// RedirectAll sends every sandbox's TCP 80 and 443 to proxyPort and its
// UDP and TCP port 53, whatever the address, to dnsPort, on the host side
// of its veth (the daemon's egress proxy and resolver), and admits exactly
// those redirected flows to the host. It adds, in one transaction:
//
//	prenat: iifname "cb*" meta nfproto ipv4 tcp dport {80,443} redirect to :proxyPort   (after the per-sandbox maps)
//	        iifname "cb*" meta nfproto ipv4 udp/tcp dport 53 redirect to :dnsPort
//	input:  iifname "cb*" ct status dnat tcp dport proxyPort accept                    (first)
//	        iifname "cb*" ct status dnat tcp/udp dport dnsPort accept
//
// so a sandbox needs no element of its own for it (booting one without a
// proxy_config costs no nftables transaction), while a per-sandbox map
// element (SetEgress) still wins over it. New's re-creation of the chains
// removes these rules: call RedirectAll after New, once per daemon.
func (m *Manager) RedirectAll(proxyPort, dnsPort uint16) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: redirect sandboxes' web and DNS: %w", err)
	}
	t := inetTable()
	fromCB := ifPrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq)
	ipv4 := nfproto(unix.NFPROTO_IPV4)
	udp := l4proto(unix.IPPROTO_UDP)
	to := func(port uint16) []expr.Any {
		return []expr.Any{
			&expr.Immediate{Register: reg, Data: binaryutil.BigEndian.PutUint16(port)},
			&expr.Redir{RegisterProtoMin: reg},
		}
	}
	prenat := &nftables.Chain{Table: t, Name: chainPreNAT}
	for _, r := range [][]expr.Any{
		slices.Concat(fromCB, ipv4, tcpDport(80), to(proxyPort)),
		slices.Concat(fromCB, ipv4, tcpDport(443), to(proxyPort)),
		slices.Concat(fromCB, ipv4, udp, udpDport(53), to(dnsPort)),
		slices.Concat(fromCB, ipv4, tcpDport(53), to(dnsPort)),
	} {
		conn.AddRule(&nftables.Rule{Table: t, Chain: prenat, Exprs: r})
	}
	input := &nftables.Chain{Table: t, Name: "input"}
	admit := func(proto []expr.Any, port uint16) []expr.Any {
		return slices.Concat(fromCB, ipv4, ctStatus(ipsDstNAT), proto, udpDport(port), verdict(expr.VerdictAccept))
	}
	for _, r := range [][]expr.Any{
		admit(l4proto(unix.IPPROTO_TCP), proxyPort),
		admit(l4proto(unix.IPPROTO_TCP), dnsPort),
		admit(udp, dnsPort),
	} {
		conn.InsertRule(&nftables.Rule{Table: t, Chain: input, Exprs: r})
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("network: redirect sandboxes' web and DNS: %w", err)
	}
	return nil
}

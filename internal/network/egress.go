package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Per-sandbox egress state lives in the inet table beside the generic
// policy, keyed by the sandbox's address so the generic rules never change:
//
//	map egress  { type ipv4_addr : verdict }              # SandboxIP → jump eg-<HostIf>
//	map proxy   { type ipv4_addr : inet_service }         # SandboxIP → proxy port
//	map dns     { type ipv4_addr : inet_service }         # SandboxIP → resolver port
//	set proxied { type ipv4_addr . inet_service }         # SandboxIP . proxy or resolver port (TCP)
//	set proxied_udp { type ipv4_addr . inet_service }     # SandboxIP . resolver port (UDP)
//	chain prenat { type nat hook prerouting priority dstnat;
//	  iifname "cb*" meta nfproto ipv4 tcp dport 80  redirect to ip saddr map @proxy
//	  iifname "cb*" meta nfproto ipv4 tcp dport 443 redirect to ip saddr map @proxy
//	  iifname "cb*" meta nfproto ipv4 udp dport 53  redirect to ip saddr map @dns
//	  iifname "cb*" meta nfproto ipv4 tcp dport 53  redirect to ip saddr map @dns
//	}
//	input:   iifname "cb*" ct status dnat ip saddr . tcp dport @proxied accept      (before the drop)
//	         iifname "cb*" ct status dnat ip saddr . udp dport @proxied_udp accept
//	forward: iifname "cb*" ip saddr vmap @egress                                   (before the final accept)
//	chain eg-<HostIf> {                       # one per sandbox with a list
//	  set eg-<HostIf> { type ipv4_addr; flags interval }   # the list's IPs and CIDRs
//	  allow: ip daddr @set accept; tcp → reject with tcp reset; else reject admin-prohibited
//	  deny:  ip daddr @set tcp → reject with tcp reset; ip daddr @set reject admin-prohibited
//	}
//
// Redirect rewrites the destination to the address of the interface the
// packet came in on (HostIP), so the proxy sees the sandbox by its source
// address and learns the real destination from conntrack (SO_ORIGINAL_DST).
// The input exception admits exactly the redirected flows of a proxied
// sandbox to its proxy and resolver ports: a sandbox dialling HostIP:port
// itself has no dnat status and is still dropped. A sandbox with a resolver
// port has all its port-53 traffic, whatever the address, answered by the
// daemon: none of it is forwarded, so port 53 is no channel out. Replacing
// one sandbox's list is a single transaction (flush chain and set, refill),
// so a PATCH never opens a gap.
const (
	mapEgress     = "egress"
	mapProxy      = "proxy"
	mapDNS        = "dns"
	setProxied    = "proxied"
	setProxiedUDP = "proxied_udp"
	chainPreNAT   = "prenat"
)

// EgressMode selects how EgressPolicy.Nets is read.
type EgressMode int

// Egress modes (see the proxy's access_control).
const (
	EgressOpen  EgressMode = iota // no list: everything not otherwise forbidden passes
	EgressAllow                   // only Nets pass; other raw IP traffic is rejected
	EgressDeny                    // Nets are rejected
)

// EgressPolicy is the packet-level part of a sandbox's egress policy. Names
// are not here: they are enforced by the proxy on Host/SNI, and DNS answers
// never become holes at this level.
type EgressPolicy struct {
	Mode EgressMode
	Nets []netip.Prefix // IPv4 only; IPv6 egress is dropped anyway
	// ProxyPort, when non-zero, redirects the sandbox's TCP 80 and 443 to
	// this port on HostIP (the daemon's transparent proxy).
	ProxyPort uint16
	// DNSPort, when non-zero, redirects the sandbox's UDP and TCP port 53,
	// to any address, to this port on HostIP (the daemon's resolver, which
	// applies the name policy). Under an allow list without it, DNS is
	// rejected like any other traffic outside Nets: port 53 of an
	// arbitrary host would be a channel around the list.
	DNSPort uint16
}

// SetEgress installs (or replaces) id's egress policy. The endpoint must
// exist. Policies are derived state: they vanish at Teardown and after a
// host reboot, and the caller re-applies them when it boots the sandbox.
func (m *Manager) SetEgress(id string, p EgressPolicy) error {
	if err := validID(id); err != nil {
		return err
	}
	unlock := m.lockID(id)
	defer unlock()
	rec, err := m.readRecord(id)
	if err != nil {
		return fmt.Errorf("network: egress %s: %w", id, err)
	}
	ep := m.endpoint(rec)
	for _, n := range p.Nets {
		if !n.Addr().Is4() {
			return fmt.Errorf("network: egress %s: %s is not IPv4: %w", id, n, errdefs.ErrInvalid)
		}
	}
	if err := ensureEgressTables(); err != nil {
		return fmt.Errorf("network: egress %s: %w", id, err)
	}
	// Clear what a previous policy left (elements whose values may differ),
	// then install the new one.
	if err := clearEgressElemsOf(ep); err != nil {
		return fmt.Errorf("network: egress %s: %w", id, err)
	}
	if err := installEgress(ep, p); err != nil {
		return fmt.Errorf("network: egress %s: %w", id, err)
	}
	return nil
}

// EgressRejected returns how many packets id's egress chain has rejected
// (0 when it has none), for the egress log.
func (m *Manager) EgressRejected(id string) (uint64, error) {
	conn, err := nftables.New()
	if err != nil {
		return 0, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	rules, err := conn.GetRules(t, &nftables.Chain{Name: egressChain(hostIfName(id)), Table: t})
	if err != nil {
		return 0, nil // no chain: nothing rejected
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if c, ok := e.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n, nil
}

func egressChain(hostIf string) string { return "eg-" + hostIf }

// ensureEgressTables declares the maps, sets and the nat chain if missing.
// Declaring existing ones keeps their elements.
func ensureEgressTables() error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	t := inetTable()
	for _, s := range egressSets(t) {
		if err := conn.AddSet(s, nil); err != nil {
			return fmt.Errorf("declare %s: %w", s.Name, err)
		}
	}
	return conn.Flush()
}

func inetTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

// egressSets are the shared maps and sets of the inet table: first the
// maps keyed by address alone, then the sets keyed by address . port.
func egressSets(t *nftables.Table) []*nftables.Set {
	return []*nftables.Set{
		{Table: t, Name: mapEgress, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict, IsMap: true},
		{Table: t, Name: mapProxy, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeInetService, IsMap: true},
		{Table: t, Name: mapDNS, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeInetService, IsMap: true},
		{Table: t, Name: setProxied, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService), Concatenation: true},
		{Table: t, Name: setProxiedUDP, KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetService), Concatenation: true},
	}
}

// egressRules are the generic egress rules, returned per chain so
// installRules can put each at its place in the same transaction: redirects
// for the nat prerouting chain, the proxy and resolver exceptions for input
// (before its drop) and the per-sandbox dispatch for forward (before its
// final accept).
func egressRules(conn *nftables.Conn, inet *nftables.Table) (pre, in [][]expr.Any, fwd []expr.Any, err error) {
	sets := egressSets(inet)
	for _, s := range sets {
		if err := conn.AddSet(s, nil); err != nil {
			return nil, nil, nil, fmt.Errorf("declare %s: %w", s.Name, err)
		}
	}
	egress, proxy, dns, proxied, proxiedUDP := sets[0], sets[1], sets[2], sets[3], sets[4]
	fromCB := ifPrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq)
	ipv4 := nfproto(unix.NFPROTO_IPV4)
	redirect := func(match []expr.Any, to *nftables.Set) []expr.Any {
		return slices.Concat(fromCB, ipv4, match, ipField(12), []expr.Any{
			&expr.Lookup{SourceRegister: reg, SetName: to.Name, SetID: to.ID, DestRegister: reg, IsDestRegSet: true},
			&expr.Redir{RegisterProtoMin: reg},
		})
	}
	pre = [][]expr.Any{
		redirect(tcpDport(80), proxy),
		redirect(tcpDport(443), proxy),
		redirect(slices.Concat(l4proto(unix.IPPROTO_UDP), udpDport(53)), dns),
		redirect(tcpDport(53), dns),
	}
	// ip saddr . th dport: concatenations use the 4-byte registers
	// NFT_REG32_00 (8) and up, laid out back to back.
	admit := func(proto byte, set *nftables.Set) []expr.Any {
		return slices.Concat(fromCB, ipv4, ctStatus(ipsDstNAT), l4proto(proto), []expr.Any{
			&expr.Payload{DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 8, SetName: set.Name, SetID: set.ID},
		}, verdict(expr.VerdictAccept))
	}
	in = [][]expr.Any{admit(unix.IPPROTO_TCP, proxied), admit(unix.IPPROTO_UDP, proxiedUDP)}
	fwd = slices.Concat(fromCB, ipv4, ipField(12), []expr.Any{
		&expr.Lookup{SourceRegister: reg, SetName: egress.Name, SetID: egress.ID, DestRegister: 0, IsDestRegSet: true},
	})
	return pre, in, fwd, nil
}

// installEgress creates ep's chain and set (empty for an open policy) and
// its map elements, in one transaction.
func installEgress(ep *Endpoint, p EgressPolicy) error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	t := inetTable()
	sets := egressSets(t)
	egress, proxy, dns, proxied, proxiedUDP := sets[0], sets[1], sets[2], sets[3], sets[4]
	name := egressChain(ep.HostIf)
	c := conn.AddChain(&nftables.Chain{Table: t, Name: name})
	conn.FlushChain(c)
	nets := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr, Interval: true}
	elems, err := intervalElems(p.Nets)
	if err != nil {
		return err
	}
	if err := conn.AddSet(nets, nil); err != nil {
		return fmt.Errorf("declare set %s: %w", name, err)
	}
	conn.FlushSet(nets)
	if len(elems) > 0 {
		if err := conn.SetAddElements(nets, elems); err != nil {
			return fmt.Errorf("fill set %s: %w", name, err)
		}
	}
	add := func(exprs ...[]expr.Any) {
		conn.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: slices.Concat(exprs...)})
	}
	inNets := slices.Concat(ipField(16), lookup(nets, false))
	tcp := l4proto(unix.IPPROTO_TCP)
	counter := []expr.Any{&expr.Counter{}}
	tcpReset := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
	prohibited := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
	switch p.Mode {
	case EgressAllow:
		add(inNets, verdict(expr.VerdictAccept))
		add(tcp, counter, tcpReset)
		add(counter, prohibited)
	case EgressDeny:
		add(inNets, tcp, counter, tcpReset)
		add(inNets, counter, prohibited)
	}
	ip := ep.SandboxIP.As4()
	if err := conn.SetAddElements(egress, []nftables.SetElement{{Key: ip[:], VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: name}}}); err != nil {
		return fmt.Errorf("map %s: %w", mapEgress, err)
	}
	// A redirect is a map element (address → port) and the input
	// exception for its redirected flows (address . port, per protocol).
	redirect := func(port uint16, to *nftables.Set, admit ...*nftables.Set) error {
		if port == 0 {
			return nil
		}
		p := binaryutil.BigEndian.PutUint16(port)
		if err := conn.SetAddElements(to, []nftables.SetElement{{Key: ip[:], Val: p}}); err != nil {
			return fmt.Errorf("map %s: %w", to.Name, err)
		}
		for _, s := range admit {
			if err := conn.SetAddElements(s, []nftables.SetElement{{Key: slices.Concat(ip[:], p, []byte{0, 0})}}); err != nil {
				return fmt.Errorf("set %s: %w", s.Name, err)
			}
		}
		return nil
	}
	if err := redirect(p.ProxyPort, proxy, proxied); err != nil {
		return err
	}
	if err := redirect(p.DNSPort, dns, proxied, proxiedUDP); err != nil {
		return err
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("commit egress of %s: %w", ep.HostIf, err)
	}
	return nil
}

// queueClearElems queues on conn the deletion of ep's map and set
// elements, whatever port an earlier daemon used, and reports whether it
// queued any. It reads them first so that the batch deletes only what
// exists: a missing element would fail the whole batch. Callers hold the
// endpoint's lock, so nothing else changes them in between.
func queueClearElems(conn *nftables.Conn, ep *Endpoint) (bool, error) {
	if !ep.SandboxIP.Is4() {
		return false, nil // no record: there can be no elements keyed by its address
	}
	ip := ep.SandboxIP.As4()
	queued := false
	for _, s := range egressSets(inetTable()) {
		elems, err := conn.GetSetElements(s)
		if err != nil {
			continue // no table yet, or no such set: nothing to delete
		}
		var mine []nftables.SetElement
		for _, e := range elems {
			if len(e.Key) >= 4 && [4]byte(e.Key[:4]) == ip {
				mine = append(mine, nftables.SetElement{Key: e.Key})
			}
		}
		if len(mine) > 0 {
			if err := conn.SetDeleteElements(s, mine); err != nil {
				return false, fmt.Errorf("delete %s's elements of %s: %w", ep.SandboxIP, s.Name, err)
			}
			queued = true
		}
	}
	return queued, nil
}

// clearEgressElemsOf deletes ep's map and set elements in one transaction.
func clearEgressElemsOf(ep *Endpoint) error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	if queued, err := queueClearElems(conn, ep); err != nil || !queued {
		return err
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete egress elements of %s: %w", ep.HostIf, err)
	}
	return nil
}

// clearEgress removes everything SetEgress made for ep, in one
// transaction: each commit waits out an RCU grace period, and a stop pays
// for every one. Missing pieces are fine; Teardown calls it.
func clearEgress(ep *Endpoint) error {
	conn, err := nftables.New()
	if err != nil {
		return err
	}
	queued, err := queueClearElems(conn, ep)
	if err != nil {
		return err
	}
	t := inetTable()
	name := egressChain(ep.HostIf)
	if _, err := conn.ListChain(t, name); err == nil {
		c := &nftables.Chain{Table: t, Name: name}
		conn.FlushChain(c)
		conn.DelChain(c)
		conn.DelSet(&nftables.Set{Table: t, Name: name})
		queued = true
	}
	if !queued {
		return nil
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete egress of %s: %w", ep.HostIf, err)
	}
	return nil
}

// intervalElems turns prefixes into the elements of an interval set:
// overlapping and adjacent ranges merged (the kernel refuses overlaps), each
// as a start key and an end key one past its last address; a range that
// runs to 255.255.255.255 has no end key.
func intervalElems(nets []netip.Prefix) ([]nftables.SetElement, error) {
	type rng struct{ lo, hi uint64 } // [lo, hi)
	var rs []rng
	for _, n := range nets {
		n = n.Masked()
		a := n.Addr().As4()
		lo := uint64(binary.BigEndian.Uint32(a[:]))
		rs = append(rs, rng{lo, lo + 1<<(32-n.Bits())})
	}
	slices.SortFunc(rs, func(a, b rng) int { return int(a.lo) - int(b.lo) })
	var merged []rng
	for _, r := range rs {
		if k := len(merged) - 1; k >= 0 && r.lo <= merged[k].hi {
			merged[k].hi = max(merged[k].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	var out []nftables.SetElement
	for _, r := range merged {
		var lo, hi [4]byte
		binary.BigEndian.PutUint32(lo[:], uint32(r.lo))
		out = append(out, nftables.SetElement{Key: lo[:]})
		if r.hi < 1<<32 {
			binary.BigEndian.PutUint32(hi[:], uint32(r.hi))
			out = append(out, nftables.SetElement{Key: hi[:], IntervalEnd: true})
		}
	}
	return out, nil
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{p}},
	}
}

func tcpDport(port uint16) []expr.Any {
	return slices.Concat(l4proto(unix.IPPROTO_TCP), []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binaryutil.BigEndian.PutUint16(port)},
	})
}

func udpDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// ctStatus matches when the conntrack status has bit set (IPS_DST_NAT:
// the flow was redirected).
func ctStatus(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: make([]byte, 4)},
	}
}

// ipsDstNAT is the conntrack status bit of a destination-NATed flow
// (IPS_DST_NAT in linux/netfilter/nf_conntrack_common.h).
const ipsDstNAT = 1 << 5

// OriginalDst returns the destination a redirected connection was sent to
// before the redirect (SO_ORIGINAL_DST from conntrack). For a connection
// that was not redirected it returns the local address. c is a TCP
// connection (*net.TCPConn or a wrapper that exposes its socket).
func OriginalDst(c syscall.Conn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = rc.Control(func(fd uintptr) {
		// The kernel writes a struct sockaddr_in; IPv6Mreq is a 20-byte
		// buffer that holds it.
		var m *unix.IPv6Mreq
		m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if serr != nil {
			return
		}
		b := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	return ap, nil
}

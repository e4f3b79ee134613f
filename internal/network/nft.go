package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The policy lives in two tables named TableName, written with
// github.com/google/nftables. Equivalent nft syntax:
//
//	table inet cubicle {
//	  set pools { type ipv4_addr; flags interval; elements = { <Config.Pool> } }
//	  chain prerouting { type filter hook prerouting priority mangle; policy accept;
//	    iifname "cb*" fib saddr . iif oif missing drop      # anti-spoofing
//	  }
//	  chain input { type filter hook input priority filter; policy accept;
//	    iifname "cb*" ct state established,related accept # replies to the daemon
//	    iifname "cb*" drop                                 # nothing new to the host
//	  }
//	  chain forward { type filter hook forward priority filter; policy accept;
//	    iifname "cb*" oifname "cb*" drop                   # no sandbox-to-sandbox
//	    ct state established,related accept
//	    oifname "cb*" drop                                 # nothing new into a sandbox
//	    iifname "cb*" meta nfproto != ipv4 drop
//	    iifname "cb*" ct state invalid drop
//	    iifname "cb*" ip saddr != @pools drop
//	    iifname "cb*" ip daddr 169.254.0.0/16 drop         # link-local, metadata
//	    iifname "cb*" ip daddr @pools drop
//	    iifname "cb*" accept
//	  }
//	}
//	table ip cubicle {
//	  set pools { type ipv4_addr; flags interval; elements = { <Config.Pool> } }
//	  chain postrouting { type nat hook postrouting priority srcnat; policy accept;
//	    ip saddr @pools oifname != "cb*" masquerade
//	  }
//	}
//
// The rules name no sandbox, so Setup and Teardown never touch them. New
// re-creates the chains' contents in one transaction (idempotent, atomic)
// and adds its pool to the sets, so Managers with different pools coexist.
// Accepting here cannot override a drop in another table's base chain at the
// same hook (an iptables FORWARD policy of DROP, say); see the package doc.
const TableName = "cubicle"

const (
	setPools = "pools"
	reg      = 1 // the nft register every rule uses
)

// RuleCount returns how many rules the cubicle tables hold, for leak checks.
func RuleCount() (int, error) {
	conn, err := nftables.New()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyINet, nftables.TableFamilyIPv4} {
		t := &nftables.Table{Family: fam, Name: TableName}
		chains, err := conn.ListChainsOfTableFamily(fam)
		if err != nil {
			return 0, err
		}
		for _, c := range chains {
			if c.Table.Name != TableName {
				continue
			}
			rules, err := conn.GetRules(t, c)
			if err != nil {
				return 0, err
			}
			n += len(rules)
		}
	}
	return n, nil
}

// installRules writes both tables in one netlink batch.
func installRules(pool netip.Prefix) error {
	conn, err := nftables.New()
	if err != nil {
		return fmt.Errorf("open nftables: %w", err)
	}
	inet := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: TableName})
	ipt := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName})
	inetPools, err := addPoolSet(conn, inet, pool)
	if err != nil {
		return err
	}
	ipPools, err := addPoolSet(conn, ipt, pool)
	if err != nil {
		return err
	}

	accept := nftables.ChainPolicyAccept
	chain := func(t *nftables.Table, name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		c := conn.AddChain(&nftables.Chain{Table: t, Name: name, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept})
		conn.FlushChain(c)
		return c
	}
	add := func(c *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		conn.AddRule(&nftables.Rule{Table: c.Table, Chain: c, Exprs: all})
	}
	fromCB := ifPrefix(expr.MetaKeyIIFNAME, expr.CmpOpEq)
	toCB := ifPrefix(expr.MetaKeyOIFNAME, expr.CmpOpEq)
	established := ctState(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED)

	pre := chain(inet, "prerouting", nftables.ChainTypeFilter, nftables.ChainHookPrerouting, nftables.ChainPriorityMangle)
	add(pre, fromCB, rpfilterMissing(), verdict(expr.VerdictDrop))

	egPre, egIn, egFwd, err := egressRules(conn, inet)
	if err != nil {
		return err
	}
	prenat := chain(inet, chainPreNAT, nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	for _, r := range egPre {
		add(prenat, r)
	}

	in := chain(inet, "input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	add(in, fromCB, established, verdict(expr.VerdictAccept))
	for _, r := range egIn {
		add(in, r)
	}
	add(in, fromCB, verdict(expr.VerdictDrop))

	fwd := chain(inet, "forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	ipv4 := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: []byte{unix.NFPROTO_IPV4}},
	}
	add(fwd, fromCB, toCB, verdict(expr.VerdictDrop))
	add(fwd, established, verdict(expr.VerdictAccept))
	add(fwd, toCB, verdict(expr.VerdictDrop))
	add(fwd, fromCB, []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: []byte{unix.NFPROTO_IPV4}},
	}, verdict(expr.VerdictDrop))
	add(fwd, fromCB, ctState(expr.CtStateBitINVALID), verdict(expr.VerdictDrop))
	add(fwd, fromCB, ipv4, ipField(12), lookup(inetPools, true), verdict(expr.VerdictDrop))
	add(fwd, fromCB, ipv4, ipField(16), prefixMatch(netip.MustParsePrefix("169.254.0.0/16")), verdict(expr.VerdictDrop))
	add(fwd, fromCB, ipv4, ipField(16), lookup(inetPools, false), verdict(expr.VerdictDrop))
	add(fwd, egFwd)
	add(fwd, fromCB, verdict(expr.VerdictAccept))

	post := chain(ipt, "postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	add(post, ipField(12), lookup(ipPools, false), ifPrefix(expr.MetaKeyOIFNAME, expr.CmpOpNeq), []expr.Any{&expr.Masq{}})

	if err := conn.Flush(); err != nil {
		return fmt.Errorf("commit tables: %w", err)
	}
	return nil
}

// addPoolSet declares the "pools" interval set in t and adds pool to it.
// Re-adding an identical interval is accepted by the kernel.
func addPoolSet(conn *nftables.Conn, t *nftables.Table, pool netip.Prefix) (*nftables.Set, error) {
	s := &nftables.Set{Table: t, Name: setPools, KeyType: nftables.TypeIPAddr, Interval: true}
	start := pool.Masked().Addr().As4()
	first := binary.BigEndian.Uint32(start[:])
	var end [4]byte
	binary.BigEndian.PutUint32(end[:], first+uint32(1)<<(32-pool.Bits())) // first address past the pool
	elems := []nftables.SetElement{
		{Key: start[:]},
		{Key: end[:], IntervalEnd: true},
	}
	if err := conn.AddSet(s, elems); err != nil {
		return nil, fmt.Errorf("declare set %s in %s: %w", setPools, t.Name, err)
	}
	return s, nil
}

// ifPrefix matches an interface name starting with HostIfPrefix (nft's
// `iifname "cb*"`): comparing only the prefix bytes is how nft encodes a
// wildcard.
func ifPrefix(key expr.MetaKey, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg},
		&expr.Cmp{Op: op, Register: reg, Data: []byte(HostIfPrefix)},
	}
}

// ctState matches when any of the given conntrack state bits is set.
func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: make([]byte, 4)},
	}
}

// rpfilterMissing matches packets whose source address is not routed back
// through the interface they came in on (`fib saddr . iif oif missing`).
func rpfilterMissing() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: reg, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: make([]byte, 4)},
	}
}

// ipField loads 4 bytes of the IPv4 header: 12 is saddr, 16 is daddr.
func ipField(offset uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}}
}

func lookup(s *nftables.Set, invert bool) []expr.Any {
	return []expr.Any{&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID, Invert: invert}}
}

// prefixMatch compares the loaded address against p.
func prefixMatch(p netip.Prefix) []expr.Any {
	a := p.Masked().Addr().As4()
	var mask [4]byte
	binary.BigEndian.PutUint32(mask[:], ^uint32(0)<<(32-p.Bits()))
	return []expr.Any{
		&expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: 4, Mask: mask[:], Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: a[:]},
	}
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}

package network

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// plumb makes ep's netns, veth pair, addresses and routes exist. Every step
// is idempotent, so it serves first setup and repair after a reboot alike.
func (m *Manager) plumb(ep *Endpoint) error {
	if err := createNetNS(ep.NetNS); err != nil {
		return err
	}
	nsh, err := netns.GetFromPath(ep.NetNS)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", ep.NetNS, err)
	}
	defer nsh.Close()
	inNS, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", ep.NetNS, err)
	}
	defer inNS.Close()

	host, created, err := m.ensureVeth(ep, nsh, inNS)
	if err != nil {
		return err
	}
	if err := configureHost(ep, host); err != nil {
		return err
	}
	if !created {
		// The sandbox end of an intact pair belongs to the runtime once it
		// runs: gVisor's netstack takes eth0 over and strips its kernel
		// address. Re-adding it would make the netns kernel answer (and
		// reset) connections meant for the sandbox.
		return nil
	}
	if err := configureSandbox(ep, inNS); err != nil {
		return err
	}
	waitOperUp(netlinkHandle{}, host.Attrs().Index)
	if eth, err := inNS.LinkByName(SandboxIfName); err == nil {
		waitOperUp(inNS, eth.Attrs().Index)
	}
	return nil
}

// operUpWait bounds waitOperUp. The kernel's link watcher normally
// activates a new veth within a millisecond; on a loaded host it can lag.
const operUpWait = 2 * time.Second

// linkGetter is what waitOperUp needs of a netlink handle (the package-level
// netlink functions for the host namespace, a *netlink.Handle for another).
type linkGetter interface {
	LinkByIndex(index int) (netlink.Link, error)
}

// netlinkHandle answers for the host namespace.
type netlinkHandle struct{}

func (netlinkHandle) LinkByIndex(index int) (netlink.Link, error) { return netlink.LinkByIndex(index) }

// waitOperUp waits (at most operUpWait) until the link reports operstate
// up. Until the kernel's link watcher has run, a freshly raised link still
// has its no-op qdisc and silently drops what is sent through it: a
// sandbox's first SYN would be lost and retried only after TCP's 1 s
// initial timeout. Past the bound the link is used anyway (a late packet is
// retransmitted, not lost for good).
func waitOperUp(h linkGetter, index int) {
	deadline := time.Now().Add(operUpWait)
	for {
		l, err := h.LinkByIndex(index)
		if err != nil || l.Attrs().OperState == netlink.OperUp || time.Now().After(deadline) {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ensureVeth returns the host end of ep's veth pair, creating the pair (peer
// born inside the netns as eth0) when it is missing or no longer joins the
// host end to this netns's eth0 (e.g. the netns was recreated).
func (m *Manager) ensureVeth(ep *Endpoint, nsh netns.NsHandle, inNS *netlink.Handle) (netlink.Link, bool, error) {
	host, err := netlink.LinkByName(ep.HostIf)
	switch {
	case err == nil:
		if vethJoined(host, inNS) {
			return host, false, nil
		}
		if err := netlink.LinkDel(host); err != nil {
			return nil, false, fmt.Errorf("delete stale %s: %w", ep.HostIf, err)
		}
	case !isLinkNotFound(err):
		return nil, false, fmt.Errorf("look up %s: %w", ep.HostIf, err)
	}
	// A stale eth0 in a reused netns would block the peer's name.
	if old, err := inNS.LinkByName(SandboxIfName); err == nil {
		if err := inNS.LinkDel(old); err != nil {
			return nil, false, fmt.Errorf("delete stale %s in %s: %w", SandboxIfName, ep.NetNS, err)
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: ep.HostIf, MTU: MTU},
		PeerName:      SandboxIfName,
		PeerNamespace: netlink.NsFd(int(nsh)),
		PeerMTU:       MTU,
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, false, fmt.Errorf("create veth %s: %w", ep.HostIf, err)
	}
	host, err = netlink.LinkByName(ep.HostIf)
	if err != nil {
		return nil, false, fmt.Errorf("look up new %s: %w", ep.HostIf, err)
	}
	return host, true, nil
}

// vethJoined reports whether host is a veth whose peer is eth0 in inNS.
func vethJoined(host netlink.Link, inNS *netlink.Handle) bool {
	if host.Type() != "veth" {
		return false
	}
	peer, err := inNS.LinkByName(SandboxIfName)
	if err != nil || peer.Type() != "veth" {
		return false
	}
	return host.Attrs().ParentIndex == peer.Attrs().Index && peer.Attrs().ParentIndex == host.Attrs().Index
}

// configureHost gives the host end HostIP/30 and brings it up. IPv6 is
// disabled on it: the policy is IPv4-only and a link-local address would
// only add a path to the host.
func configureHost(ep *Endpoint, host netlink.Link) error {
	if err := writeSysctl("/proc/sys/net/ipv6/conf/"+ep.HostIf+"/disable_ipv6", "1"); err != nil {
		return fmt.Errorf("disable ipv6 on %s: %w", ep.HostIf, err)
	}
	if err := netlink.AddrReplace(host, addr(ep.HostIP, ep.PrefixLen)); err != nil {
		return fmt.Errorf("address %s: %w", ep.HostIf, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("bring up %s: %w", ep.HostIf, err)
	}
	return nil
}

// configureSandbox brings up lo and eth0 with SandboxIP/30 and a default
// route via HostIP inside the netns.
func configureSandbox(ep *Endpoint, inNS *netlink.Handle) error {
	lo, err := inNS.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("look up lo in %s: %w", ep.NetNS, err)
	}
	if err := inNS.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring up lo in %s: %w", ep.NetNS, err)
	}
	eth, err := inNS.LinkByName(SandboxIfName)
	if err != nil {
		return fmt.Errorf("look up %s in %s: %w", SandboxIfName, ep.NetNS, err)
	}
	if err := inNS.AddrReplace(eth, addr(ep.SandboxIP, ep.PrefixLen)); err != nil {
		return fmt.Errorf("address %s in %s: %w", SandboxIfName, ep.NetNS, err)
	}
	if err := inNS.LinkSetUp(eth); err != nil {
		return fmt.Errorf("bring up %s in %s: %w", SandboxIfName, ep.NetNS, err)
	}
	route := &netlink.Route{
		LinkIndex: eth.Attrs().Index,
		Dst:       &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		Gw:        ep.HostIP.AsSlice(),
		Scope:     netlink.SCOPE_UNIVERSE,
	}
	if err := inNS.RouteReplace(route); err != nil {
		return fmt.Errorf("default route in %s: %w", ep.NetNS, err)
	}
	return nil
}

// unplumb deletes ep's veth pair (the peer goes with it) and its netns
// mount. Missing pieces are fine.
func (m *Manager) unplumb(ep *Endpoint) error {
	var errs []error
	if l, err := netlink.LinkByName(ep.HostIf); err == nil {
		if err := netlink.LinkDel(l); err != nil && !isLinkNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", ep.HostIf, err))
		}
	} else if !isLinkNotFound(err) {
		errs = append(errs, fmt.Errorf("look up %s: %w", ep.HostIf, err))
	}
	if err := deleteNetNS(ep.NetNS); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, 32)}}
}

func isLinkNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

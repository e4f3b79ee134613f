package microvm

import (
	"errors"
	"fmt"
	"net"
	"os"
	goruntime "runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// The guest's network: QEMU, started inside the sandbox's netns, opens a
// tap device there (tapName), and traffic crosses between it and the
// netns' veth end with two tc mirred redirects, as Kata Containers does.
// The netns' own stack then sees nothing: the guest owns the sandbox's
// address (configured by the kernel's ip= from the veth's address and
// default route) and its MAC (the veth's, so the host side's neighbour
// entry stays right). Every host-side rule — NAT, the nftables filter,
// the egress proxy's redirects, service URLs — applies unchanged, since
// they act on the host end of the veth.
const tapName = "tap0"

// guestNet is what the guest needs to be the sandbox's address.
type guestNet struct {
	Link    string // the veth end in the netns
	IP      net.IP
	Mask    net.IPMask
	Gateway net.IP
	MAC     net.HardwareAddr
	MTU     int
}

// kernelArg is the kernel's ip= parameter for n (no autoconfiguration).
func (n guestNet) kernelArg(hostname string) string {
	return fmt.Sprintf("ip=%s::%s:%s:%s:eth0:off", n.IP, n.Gateway, net.IP(n.Mask), hostname)
}

// readNet finds the netns' one non-loopback link and its IPv4 address and
// default route, as the manager configured them.
func readNet(nsPath string) (guestNet, error) {
	h, done, err := network.NSHandle(nsPath)
	if err != nil {
		return guestNet{}, err
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return guestNet{}, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.Name == tapName {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return guestNet{}, fmt.Errorf("addresses of %s: %w", a.Name, err)
		}
		if len(addrs) == 0 {
			continue
		}
		n := guestNet{Link: a.Name, IP: addrs[0].IP, Mask: addrs[0].Mask, MAC: a.HardwareAddr, MTU: a.MTU}
		routes, err := h.RouteList(l, netlink.FAMILY_V4)
		if err != nil {
			return guestNet{}, fmt.Errorf("routes of %s: %w", a.Name, err)
		}
		for _, r := range routes {
			// netlink reports a default route's Dst as nil or 0.0.0.0/0.
			if isDefault := r.Dst == nil || isZeroPrefix(r.Dst); isDefault && r.Gw != nil {
				n.Gateway = r.Gw
			}
		}
		if n.Gateway == nil {
			return guestNet{}, fmt.Errorf("netns %s: no default route on %s", nsPath, a.Name)
		}
		return n, nil
	}
	return guestNet{}, fmt.Errorf("netns %s: no link with an IPv4 address", nsPath)
}

// inNetNS runs fn on a thread that has joined the netns at path; the
// thread is never reused (it exits with fn's goroutine), so nothing else
// runs in the sandbox's netns.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		ns, err := netns.GetFromPath(path)
		if err != nil {
			errc <- fmt.Errorf("open netns %s: %w", path, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("join netns %s: %w", path, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// connectTap raises the tap QEMU opened and redirects every frame between
// it and n.Link both ways.
func connectTap(nsPath string, n guestNet) error {
	h, done, err := network.NSHandle(nsPath)
	if err != nil {
		return err
	}
	defer done()
	tap, err := h.LinkByName(tapName)
	if err != nil {
		return fmt.Errorf("find %s: %w", tapName, err)
	}
	veth, err := h.LinkByName(n.Link)
	if err != nil {
		return fmt.Errorf("find %s: %w", n.Link, err)
	}
	if err := h.LinkSetMTU(tap, n.MTU); err != nil {
		return fmt.Errorf("mtu of %s: %w", tapName, err)
	}
	if err := h.LinkSetUp(tap); err != nil {
		return fmt.Errorf("raise %s: %w", tapName, err)
	}
	for _, p := range [][2]netlink.Link{{veth, tap}, {tap, veth}} {
		if err := redirect(h, p[0], p[1]); err != nil {
			return err
		}
	}
	return nil
}

// redirect sends every frame arriving on from out of to.
func redirect(h *netlink.Handle, from, to netlink.Link) error {
	idx := from.Attrs().Index
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: idx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := h.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: idx, Parent: netlink.MakeHandle(0xffff, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Keys: []netlink.TcU32Key{{Mask: 0, Val: 0}}, Flags: netlink.TC_U32_TERMINAL},
		Actions:     []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
	}
	if err := h.FilterAdd(f); err != nil {
		return fmt.Errorf("redirect %s to %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}

// disconnect removes the redirect from the veth end (the tap, and its
// qdisc, go with QEMU), so the netns is as the manager handed it over. A
// netns or link that is gone already is fine.
func disconnect(nsPath, link string) error {
	h, done, err := network.NSHandle(nsPath)
	if err != nil {
		return nil
	}
	defer done()
	l, err := h.LinkByName(link)
	if err != nil {
		return nil
	}
	q := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("remove redirect from %s: %w", link, err)
	}
	return nil
}

func isZeroPrefix(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// openTap creates tapName in the calling thread's netns and returns its
// queue for QEMU (which then needs neither the netns nor CAP_NET_ADMIN).
// The device lives while a queue is open: it goes with QEMU. Its flags are
// those QEMU asks for when it opens a tap itself.
func openTap() (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(tapName)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("create %s: %w", tapName, err)
	}
	return os.NewFile(uintptr(fd), tapName), nil
}

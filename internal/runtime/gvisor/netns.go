package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// netnsFile records, in the bundle dir, the network configuration runsc
// takes over from the sandbox's netns.
const netnsFile = "netns.json"

// With --network=sandbox, runsc moves the netns' IP configuration into the
// Sentry's netstack: it deletes every address and route from the host side
// of the interfaces it takes, and does not put them back on delete. A
// stopped sandbox would thus leave a netns that a later Start (a restarted
// sandbox on the same network endpoint) cannot use. The driver therefore
// records the configuration before Start and restores it when the sandbox
// is destroyed, so the manager gets its netns back as it handed it over.

// netConfig is the part of a netns' configuration that runsc removes.
type netConfig struct {
	NetNS  string       `json:"netns"`
	Addrs  []savedAddr  `json:"addrs"`
	Routes []savedRoute `json:"routes"`
}

type savedAddr struct {
	Link   string `json:"link"`
	Prefix string `json:"prefix"` // CIDR
}

type savedRoute struct {
	Link     string `json:"link"`
	Dst      string `json:"dst,omitempty"` // CIDR; empty for a default route
	Gw       string `json:"gw,omitempty"`
	Src      string `json:"src,omitempty"`
	Family   int    `json:"family"`
	Scope    int    `json:"scope"`
	Protocol int    `json:"protocol"`
	Priority int    `json:"priority,omitempty"`
}

// saveNetConfig records the addresses and main-table routes of every
// non-loopback interface in the netns at nsPath into dir/netns.json.
func saveNetConfig(nsPath, dir string) error {
	h, done, err := network.NSHandle(nsPath)
	if err != nil {
		return err
	}
	defer done()
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("list links in %s: %w", nsPath, err)
	}
	cfg := netConfig{NetNS: nsPath}
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", a.Name, err)
		}
		for _, ad := range addrs {
			if ad.IP.IsLinkLocalUnicast() {
				continue // the kernel makes these itself
			}
			cfg.Addrs = append(cfg.Addrs, savedAddr{Link: a.Name, Prefix: ad.IPNet.String()})
		}
		routes, err := h.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list routes of %s: %w", a.Name, err)
		}
		for _, r := range routes {
			if r.Table != unix.RT_TABLE_MAIN || r.Protocol == unix.RTPROT_KERNEL {
				continue // prefix routes come back with their addresses
			}
			sr := savedRoute{Link: a.Name, Family: r.Family, Scope: int(r.Scope), Protocol: int(r.Protocol), Priority: r.Priority}
			if r.Dst != nil {
				sr.Dst = r.Dst.String()
			}
			if r.Gw != nil {
				sr.Gw = r.Gw.String()
			}
			if r.Src != nil {
				sr.Src = r.Src.String()
			}
			cfg.Routes = append(cfg.Routes, sr)
		}
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, netnsFile), data, 0o600); err != nil {
		return fmt.Errorf("record netns config: %w", err)
	}
	return nil
}

// restoreNetConfig puts back what saveNetConfig recorded in dir, in the
// netns it was recorded from. Entries that already exist are fine; a missing
// record, netns or link means there is nothing to restore. Call it only once
// the sandbox is dead, or the host stack would answer for the sandbox's
// addresses.
func restoreNetConfig(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, netnsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read netns config: %w", err)
	}
	var cfg netConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("decode netns config: %w", err)
	}
	h, done, err := network.NSHandle(cfg.NetNS)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer done()
	var errs []error
	for _, a := range cfg.Addrs {
		l, err := h.LinkByName(a.Link)
		if err != nil {
			continue // the manager deleted it: nothing to give back
		}
		addr, err := netlink.ParseAddr(a.Prefix)
		if err == nil {
			err = h.AddrReplace(l, addr)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("restore address %s on %s: %w", a.Prefix, a.Link, err))
		}
	}
	for _, r := range cfg.Routes {
		l, err := h.LinkByName(r.Link)
		if err != nil {
			continue
		}
		route := &netlink.Route{LinkIndex: l.Attrs().Index, Family: r.Family, Scope: netlink.Scope(r.Scope),
			Protocol: netlink.RouteProtocol(r.Protocol), Priority: r.Priority,
			Gw: net.ParseIP(r.Gw), Src: net.ParseIP(r.Src)}
		if r.Dst != "" {
			if _, route.Dst, err = net.ParseCIDR(r.Dst); err != nil {
				errs = append(errs, fmt.Errorf("restore route to %s: %w", r.Dst, err))
				continue
			}
		}
		if err := h.RouteReplace(route); err != nil {
			errs = append(errs, fmt.Errorf("restore route to %q via %s on %s: %w", r.Dst, r.Gw, r.Link, err))
		}
	}
	return errors.Join(errs...)
}

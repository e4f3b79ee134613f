package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// ErrForbiddenAddr marks a dial refused because the address belongs to the
// host, loopback, link-local space or the sandbox pool.
var ErrForbiddenAddr = errors.New("destination address is not reachable from sandboxes")

// dial connects to host:port for sb: names are resolved by the daemon (with
// Config.Resolve first), every candidate address is checked against the
// forbidden ranges and, in deny mode, the sandbox's denied CIDRs.
func (s *Service) dial(ctx context.Context, sb *sandbox, host string, port uint16) (net.Conn, error) {
	addrs, err := s.resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	pol := sb.policy.Load()
	var errs []error
	d := net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	for _, a := range addrs {
		if s.forbidden(a) {
			errs = append(errs, fmt.Errorf("%s resolves to %s: %w", host, a, ErrForbiddenAddr))
			continue
		}
		if reason, denied := pol.denyAddr(a); denied {
			errs = append(errs, fmt.Errorf("%s resolves to %s: %s: %w", host, a, reason, errDenied))
			continue
		}
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("%s: no IPv4 address", host)
	}
	return nil, errors.Join(errs...)
}

// errDenied marks a dial refused by the sandbox's deny_list.
var errDenied = errors.New("denied by policy")

func (s *Service) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	if a, ok := s.cfg.Resolve[host]; ok {
		return []netip.Addr{a}, nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, nil
}

// forbidden reports whether a is loopback, link-local, unspecified,
// multicast, in a Config.Forbidden prefix, or an address of this host.
func (s *Service) forbidden(a netip.Addr) bool {
	if !a.Is4() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() ||
		a.IsLinkLocalMulticast() || a == netip.IPv4Unspecified() || a.As4()[0] == 0 || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return true
	}
	for _, p := range s.cfg.Forbidden {
		if p.Contains(a) {
			return true
		}
	}
	return s.local.has(a)
}

// localAddrs caches the host's interface addresses for a few seconds.
type localAddrs struct {
	mu    sync.Mutex
	at    time.Time
	addrs map[netip.Addr]bool
}

func (l *localAddrs) has(a netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if time.Since(l.at) > 5*time.Second || l.addrs == nil {
		l.addrs = map[netip.Addr]bool{}
		ifAddrs, err := net.InterfaceAddrs()
		if err != nil {
			return true // fail closed
		}
		for _, ia := range ifAddrs {
			if n, ok := ia.(*net.IPNet); ok {
				if x, ok := netip.AddrFromSlice(n.IP); ok {
					l.addrs[x.Unmap()] = true
				}
			}
		}
		l.at = time.Now()
	}
	return l.addrs[a]
}

// newTransport returns sb's upstream transport: its own connection pool
// (so no connection is shared between sandboxes with different policies),
// the proxy's dialer, and verification against the host's roots plus
// --egress-ca-file.
func (s *Service) newTransport(sb *sandbox) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, p, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			port, err := strconv.ParseUint(p, 10, 16)
			if err != nil {
				return nil, err
			}
			return s.dial(ctx, sb, host, uint16(port))
		},
		TLSClientConfig:       &tls.Config{RootCAs: s.roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 5 * time.Minute,
		MaxIdleConnsPerHost:   32,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass bodies through as the server sent them
		// Every sandbox's web traffic goes through here: large reads
		// keep bulk downloads near the speed of a direct connection.
		ReadBufferSize:  relayBuffer,
		WriteBufferSize: relayBuffer,
	}
}

package runtime

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// Nameservers returns the nameservers the drivers write into a sandbox's
// resolv.conf when it is derived from hostResolv: the host's nameservers
// that are neither loopback nor unspecified (systemd-resolved's 127.0.0.53
// lives in the host's namespace), else the public fallback the drivers use
// (gVisor names 1.1.1.1, namespace 1.1.1.1 and 8.8.8.8). The egress policy
// opens DNS toward exactly these, so a sandbox under an allow list cannot
// use port 53 of any other address as a channel.
func Nameservers(hostResolv string) ([]netip.Addr, error) {
	data, err := os.ReadFile(hostResolv)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read host resolv.conf: %w", err)
	}
	var out []netip.Addr
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(f[1]); err == nil && !a.IsLoopback() && !a.IsUnspecified() {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 {
		out = []netip.Addr{netip.AddrFrom4([4]byte{1, 1, 1, 1}), netip.AddrFrom4([4]byte{8, 8, 8, 8})}
	}
	return out, nil
}

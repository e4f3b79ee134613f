package network

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Counters are the bytes a sandbox's network moved, as the sandbox sees
// them: Rx what it received, Tx what it sent.
type Counters struct{ RxBytes, TxBytes int64 }

// Counters reads sandbox id's traffic from its host-side veth. The host
// side receives what the sandbox sends, so the directions swap.
func (m *Manager) Counters(id string) (Counters, error) {
	return readCounters("/sys/class/net", hostIfName(id))
}

// readCounters reads interface ifname's byte counters under sysfs dir
// (/sys/class/net).
func readCounters(dir, ifname string) (Counters, error) {
	var c Counters
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"tx_bytes", &c.RxBytes}, {"rx_bytes", &c.TxBytes}} {
		b, err := os.ReadFile(filepath.Join(dir, ifname, "statistics", f.name))
		if err != nil {
			return c, fmt.Errorf("read %s counters: %w", ifname, err)
		}
		if *f.dst, err = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return c, fmt.Errorf("read %s counters: %w", ifname, err)
		}
	}
	return c, nil
}

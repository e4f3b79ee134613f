package sandbox

import (
	"context"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// netCounter is implemented by Networks that can count a sandbox's
// traffic (internal/network.Manager).
type netCounter interface {
	Counters(id string) (network.Counters, error)
}

// MaxMeteredSandboxes bounds how many running sandboxes Census measures,
// and so the label cardinality of per-sandbox metrics.
const MaxMeteredSandboxes = 1000

// Stats returns sandbox name's resource use, for whoever may see it.
func (m *Manager) Stats(ctx context.Context, name string) (*protocol.SandboxStats, error) {
	sb, err := m.visible(ctx, name, authz.Get)
	if err != nil {
		return nil, err
	}
	st := m.measure(ctx, []*store.Sandbox{sb}, 1)
	return &st[0], nil
}

// ListStats returns the resource use of every sandbox the caller may see.
func (m *Manager) ListStats(ctx context.Context) ([]protocol.SandboxStats, error) {
	sbs, err := m.ListSandboxes(ctx, store.ListOptions{})
	if err != nil {
		return nil, err
	}
	return m.measure(ctx, sbs, len(sbs)), nil
}

// Census returns every sandbox of every workspace with its state, and the
// usage of up to MaxMeteredSandboxes of the running ones, for metrics. It
// is the daemon's view, not a caller's: no principal is needed.
func (m *Manager) Census(ctx context.Context) ([]protocol.SandboxStats, error) {
	sbs, err := m.cfg.Store.AllSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	return m.measure(ctx, sbs, MaxMeteredSandboxes), nil
}

// measure samples sbs, reading the usage of at most max running ones (the
// others get only their identity and state). Counters that cannot be read
// (a sandbox stopping under us, a driver that cannot measure) stay zero:
// stats are best effort and never fail the request.
func (m *Manager) measure(ctx context.Context, sbs []*store.Sandbox, max int) []protocol.SandboxStats {
	out := make([]protocol.SandboxStats, len(sbs))
	var rids []string
	metered := 0
	for i, sb := range sbs {
		st := &out[i]
		*st = protocol.SandboxStats{ID: sb.ID, Name: sb.Name, Status: sb.Status, Runtime: sb.Runtime, SampledAt: time.Now().UTC(),
			VCPUs: sb.VCPUs, MemoryLimitBytes: sb.MemBytes, DiskBytes: -1, DiskLimitBytes: sb.FSCapacityBytes}
		if metered >= max || statusOf(sb) != Ready {
			continue
		}
		metered++
		rid := runtimeID(sb.ID)
		rids = append(rids, rid)
		d, _ := m.rt.get(sb.Runtime) // nil for a runtime not served: no meter
		if meter, ok := d.(runtime.Meter); ok {
			if u, err := meter.Usage(ctx, rid); err == nil {
				st.CPUSeconds, st.MemoryBytes = u.CPU.Seconds(), u.MemoryBytes
			}
		}
		if nc, ok := m.cfg.Network.(netCounter); ok {
			if c, err := nc.Counters(rid); err == nil {
				st.NetRxBytes, st.NetTxBytes = c.RxBytes, c.TxBytes
			}
		}
	}
	if len(rids) == 0 {
		return out
	}
	used, err := m.cfg.Storage.Usage(ctx, rids, nil)
	if err != nil {
		m.log.Debug("stats: measure disk use", "err", err)
		return out
	}
	for i := range out {
		if n, ok := used[runtimeID(out[i].ID)]; ok {
			out[i].DiskBytes = n
		}
	}
	return out
}

package network

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"
)

// Flow is one finished TCP or UDP flow a sandbox opened that did not go
// through the daemon (its 80/443 and DNS are redirected to the proxy and
// resolver, which record those themselves), from conntrack accounting.
// Up is what the sandbox sent, Down what it received.
type Flow struct {
	Proto                  string // "tcp" or "udp"
	Src, Dst               netip.AddrPort
	BytesUp, BytesDown     uint64
	PacketsUp, PacketsDown uint64
	// Start is when conntrack first saw the flow; zero when its
	// timestamps are off (then Duration is 0 too).
	Start    time.Time
	Duration time.Duration
}

// TCP conntrack states after which a flow carries no more data
// (TCP_CONNTRACK_TIME_WAIT and _CLOSE in nf_conntrack_tcp.h).
const (
	tcpTimeWait = 7
	tcpClose    = 8
)

// The conntrack sysctls that make flows carry byte counters and start
// times; both apply to flows created after they are set.
var flowSysctls = []string{
	"/proc/sys/net/netfilter/nf_conntrack_acct",
	"/proc/sys/net/netfilter/nf_conntrack_timestamp",
}

// WatchFlows reports every finished flow of the pool's sandboxes to emit
// until ctx ends. It turns on conntrack accounting and timestamps (host
// wide) and listens to conntrack's update and destroy events: a TCP flow
// is reported when it reaches TIME_WAIT or CLOSE (its counters read then,
// not two minutes later when the entry expires), anything else when its
// entry is destroyed (a UDP flow after conntrack's idle timeout, 30 s
// unanswered or 120 s). emit must not block for long: events queue in
// the netlink socket meanwhile, and when it overflows the listener fails
// (ENOBUFS) and WatchFlows returns the error; the caller starts it again,
// having lost those events.
func (m *Manager) WatchFlows(ctx context.Context, emit func(Flow)) error {
	for _, p := range flowSysctls {
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("network: enable conntrack accounting: %w", err)
		}
	}
	listen, err := conntrack.Dial(nil)
	if err != nil {
		return fmt.Errorf("network: conntrack events: %w", err)
	}
	query, err := conntrack.Dial(nil)
	if err != nil {
		listen.Close()
		return fmt.Errorf("network: conntrack: %w", err)
	}
	_ = listen.SetReadBuffer(4 << 20)
	evs := make(chan conntrack.Event, 1024)
	errs, err := listen.Listen(evs, 1, []netfilter.NetlinkGroup{netfilter.GroupCTUpdate, netfilter.GroupCTDestroy})
	if err != nil {
		listen.Close()
		query.Close()
		return fmt.Errorf("network: conntrack listen: %w", err)
	}
	defer query.Close()
	defer func() {
		// Close waits for the listener's worker, which may be blocked
		// handing over an event or an error: drain until it is gone.
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-evs:
				case <-errs:
				case <-stop:
					return
				}
			}
		}()
		listen.Close()
		close(stop)
	}()
	w := newFlowWatcher(m.pool, query.Get)
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("network: conntrack events: %w", err)
		case ev := <-evs:
			if f, ok := w.handle(ev, time.Now()); ok {
				emit(f)
			}
		}
	}
}

// flowWatcher turns conntrack events into Flows, each once. Not safe for
// concurrent use.
type flowWatcher struct {
	pool netip.Prefix
	get  func(conntrack.Flow) (conntrack.Flow, error)
	// done holds the ids of TCP flows reported at TIME_WAIT/CLOSE, so
	// their destroy event is not reported again; entries go after
	// doneTTL (longer than TIME_WAIT's 120 s).
	done  map[uint32]time.Time
	swept time.Time
}

const (
	doneTTL = 5 * time.Minute
	doneMax = 1 << 16
)

func newFlowWatcher(pool netip.Prefix, get func(conntrack.Flow) (conntrack.Flow, error)) *flowWatcher {
	return &flowWatcher{pool: pool, get: get, done: map[uint32]time.Time{}}
}

// handle returns the flow ev finishes, if it is a sandbox's.
func (w *flowWatcher) handle(ev conntrack.Event, now time.Time) (Flow, bool) {
	if ev.Flow == nil || !w.ours(*ev.Flow) {
		return Flow{}, false
	}
	f := *ev.Flow
	switch ev.Type {
	case conntrack.EventUpdate:
		tcp := f.ProtoInfo.TCP
		if tcp == nil || tcp.State != tcpTimeWait && tcp.State != tcpClose {
			return Flow{}, false
		}
		if _, seen := w.done[f.ID]; seen {
			return Flow{}, false
		}
		full, err := w.get(f)
		if err != nil {
			return Flow{}, false // gone meanwhile: its destroy event reports it
		}
		w.sweep(now)
		w.done[f.ID] = now
		return flowOf(full, now), true
	case conntrack.EventDestroy:
		if _, seen := w.done[f.ID]; seen {
			delete(w.done, f.ID)
			return Flow{}, false
		}
		return flowOf(f, now), true
	}
	return Flow{}, false
}

// ours reports whether f is a flow a sandbox of the pool opened to an
// address outside it, not redirected to the daemon.
func (w *flowWatcher) ours(f conntrack.Flow) bool {
	o := f.TupleOrig
	p := o.Proto.Protocol
	return (p == unix.IPPROTO_TCP || p == unix.IPPROTO_UDP) && !f.Status.DstNAT() &&
		w.pool.Contains(o.IP.SourceAddress.Unmap()) && !w.pool.Contains(o.IP.DestinationAddress.Unmap())
}

// sweep forgets reported flows older than doneTTL, at most once a minute,
// and everything when done has grown past doneMax.
func (w *flowWatcher) sweep(now time.Time) {
	if len(w.done) >= doneMax {
		clear(w.done)
	}
	if now.Sub(w.swept) < time.Minute {
		return
	}
	w.swept = now
	for id, t := range w.done {
		if now.Sub(t) > doneTTL {
			delete(w.done, id)
		}
	}
}

// flowOf is f as a Flow ending at now (or at f's stop time when it has one).
func flowOf(f conntrack.Flow, now time.Time) Flow {
	o := f.TupleOrig
	out := Flow{Proto: "udp",
		Src:     netip.AddrPortFrom(o.IP.SourceAddress.Unmap(), o.Proto.SourcePort),
		Dst:     netip.AddrPortFrom(o.IP.DestinationAddress.Unmap(), o.Proto.DestinationPort),
		BytesUp: f.CountersOrig.Bytes, PacketsUp: f.CountersOrig.Packets,
		BytesDown: f.CountersReply.Bytes, PacketsDown: f.CountersReply.Packets,
		Start: f.Timestamp.Start}
	if o.Proto.Protocol == unix.IPPROTO_TCP {
		out.Proto = "tcp"
	}
	if !out.Start.IsZero() {
		end := f.Timestamp.Stop
		if end.IsZero() {
			end = now
		}
		out.Duration = max(0, end.Sub(out.Start))
	}
	return out
}

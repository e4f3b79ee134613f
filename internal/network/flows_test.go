package network

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

// ctFlow is a conntrack flow from src to dst (ip:port) with proto.
func ctFlow(id uint32, proto uint8, src, dst string) *conntrack.Flow {
	s, d := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst)
	f := &conntrack.Flow{ID: id}
	f.TupleOrig.IP = conntrack.IPTuple{SourceAddress: s.Addr(), DestinationAddress: d.Addr()}
	f.TupleOrig.Proto = conntrack.ProtoTuple{Protocol: proto, SourcePort: s.Port(), DestinationPort: d.Port()}
	return f
}

func withTCPState(f *conntrack.Flow, state uint8) *conntrack.Flow {
	f.ProtoInfo.TCP = &conntrack.ProtoInfoTCP{State: state}
	return f
}

// TestFlowWatcher feeds conntrack events: a sandbox's TCP flow is
// reported once, at TIME_WAIT, with the counters read then (not at its
// destroy); a UDP flow at its destroy; redirected flows, the host's own
// and sandbox-to-sandbox ones never.
func TestFlowWatcher(t *testing.T) {
	pool := netip.MustParsePrefix("10.244.0.0/16")
	start := time.Unix(1700000000, 0)
	now := start.Add(1500 * time.Millisecond)
	var gets int
	w := newFlowWatcher(pool, func(f conntrack.Flow) (conntrack.Flow, error) {
		gets++
		if f.ID == 99 {
			return f, errors.New("no such flow")
		}
		f.CountersOrig = conntrack.Counter{Bytes: 120, Packets: 3}
		f.CountersReply = conntrack.Counter{Bytes: 4096, Packets: 4}
		f.Timestamp.Start = start
		return f, nil
	})
	tcp := func(id uint32) *conntrack.Flow {
		return ctFlow(id, unix.IPPROTO_TCP, "10.244.0.5:40000", "198.18.0.2:7000")
	}
	type step struct {
		ev   conntrack.Event
		want bool
	}
	established := conntrack.Event{Type: conntrack.EventUpdate, Flow: withTCPState(tcp(1), 3)}
	timeWait := conntrack.Event{Type: conntrack.EventUpdate, Flow: withTCPState(tcp(1), tcpTimeWait)}
	for i, s := range []step{
		{established, false},
		{timeWait, true},
		{timeWait, false}, // repeated update
		{conntrack.Event{Type: conntrack.EventDestroy, Flow: tcp(1)}, false}, // reported already
	} {
		f, ok := w.handle(s.ev, now)
		if ok != s.want {
			t.Fatalf("step %d: reported %v, want %v", i, ok, s.want)
		}
		if ok {
			want := Flow{Proto: "tcp", Src: netip.MustParseAddrPort("10.244.0.5:40000"), Dst: netip.MustParseAddrPort("198.18.0.2:7000"),
				BytesUp: 120, PacketsUp: 3, BytesDown: 4096, PacketsDown: 4, Start: start, Duration: 1500 * time.Millisecond}
			if f != want {
				t.Fatalf("flow %+v, want %+v", f, want)
			}
		}
	}
	if gets != 1 {
		t.Fatalf("%d conntrack reads, want 1", gets)
	}
	udp := ctFlow(2, unix.IPPROTO_UDP, "10.244.0.5:5353", "198.18.0.2:9999")
	udp.CountersOrig.Bytes, udp.CountersReply.Bytes = 30, 60
	if f, ok := w.handle(conntrack.Event{Type: conntrack.EventDestroy, Flow: udp}, now); !ok || f.Proto != "udp" || f.BytesUp != 30 || f.BytesDown != 60 || f.Duration != 0 {
		t.Fatalf("udp destroy: %+v %v", f, ok)
	}
	// A TCP flow gone before it could be read is reported at its destroy.
	if _, ok := w.handle(conntrack.Event{Type: conntrack.EventUpdate, Flow: withTCPState(tcp(99), tcpClose)}, now); ok {
		t.Fatal("unreadable flow reported at its update")
	}
	if _, ok := w.handle(conntrack.Event{Type: conntrack.EventDestroy, Flow: tcp(99)}, now); !ok {
		t.Fatal("unreadable flow not reported at its destroy")
	}
	redirected := tcp(3)
	redirected.Status = conntrack.StatusDstNAT
	for name, f := range map[string]*conntrack.Flow{
		"redirected to the proxy": redirected,
		"host's own":              ctFlow(4, unix.IPPROTO_TCP, "192.168.1.2:5000", "198.18.0.2:80"),
		"sandbox to sandbox":      ctFlow(5, unix.IPPROTO_TCP, "10.244.0.5:5000", "10.244.0.9:80"),
		"icmp":                    ctFlow(6, unix.IPPROTO_ICMP, "10.244.0.5:0", "198.18.0.2:0"),
	} {
		if _, ok := w.handle(conntrack.Event{Type: conntrack.EventDestroy, Flow: f}, now); ok {
			t.Fatalf("%s flow reported", name)
		}
	}
}

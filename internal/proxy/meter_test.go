package proxy

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// meterRecorder is a Meter that records what it is told.
type meterRecorder struct {
	nopMeter // no spans
	mu       sync.Mutex
	verdicts map[string]int
	up, down int64
}

func (m *meterRecorder) Egress(kind string, allowed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.verdicts == nil {
		m.verdicts = map[string]int{}
	}
	v := kind + " denied"
	if allowed {
		v = kind + " allowed"
	}
	m.verdicts[v]++
}

func (m *meterRecorder) EgressBytes(up, down int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.up += up
	m.down += down
}

func TestEventLogCountsDecisionsOnItsMeter(t *testing.T) {
	m := &meterRecorder{}
	l := eventLog{meter: m}
	l.add(Event{Kind: "http", Allowed: true}, false)
	l.add(Event{Kind: "tls"}, false)
	l.add(Event{Kind: "tls"}, false)
	if m.verdicts["http allowed"] != 1 || m.verdicts["tls denied"] != 2 || len(m.verdicts) != 2 {
		t.Fatalf("meter saw %v", m.verdicts)
	}
}

func TestSpliceCountsBothWays(t *testing.T) {
	sandboxSide, proxyIn := net.Pipe()
	proxyOut, upstream := net.Pipe()
	done := make(chan [2]int64)
	go func() {
		a, b := splice(proxyIn, proxyOut)
		done <- [2]int64{a, b}
	}()
	// The upstream answers 300 bytes to 120 and hangs up; the sandbox
	// reads the answer and hangs up too.
	go func() {
		io.ReadFull(upstream, make([]byte, 120))
		io.WriteString(upstream, strings.Repeat("d", 300))
		upstream.Close()
	}()
	go func() {
		io.WriteString(sandboxSide, strings.Repeat("u", 120))
		io.ReadFull(sandboxSide, make([]byte, 300))
		sandboxSide.Close()
	}()
	if got := <-done; got != [2]int64{120, 300} {
		t.Fatalf("splice counted up/down %v, want [120 300]", got)
	}
}

package proxy

import (
	"context"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ReasonPassThrough is the verdict reason of a sandbox without a
// proxy_config: the proxy allows everything and only records.
const ReasonPassThrough = "pass-through: no proxy_config"

// Recorder receives the proxy's network events for the sandbox's audit
// record (*record.Recorder implements it). It must not block: it is called
// as each request, connection and query finishes.
type Recorder interface {
	// Network records an event of typ begun at at (which picks the
	// command step it belongs to).
	Network(ctx context.Context, sandboxID, workspaceID, typ string, at time.Time, data map[string]any)
}

type nopRecorder struct{}

func (nopRecorder) Network(context.Context, string, string, string, time.Time, map[string]any) {}

// recorder is Config.Recorder, or one recording nothing.
func (s *Service) recorder() Recorder {
	if s.cfg.Recorder == nil {
		return nopRecorder{}
	}
	return s.cfg.Recorder
}

// verdictData is the decision part every event carries; rules are the
// names of the rules applied, never their values.
func verdictData(ev Event) map[string]any {
	d := map[string]any{"allowed": ev.Allowed, "reason": ev.Reason}
	if len(ev.Rules) > 0 {
		d["rules"] = ev.Rules
	}
	return d
}

// recordRequest records one HTTP request of a plain connection or of an
// intercepted TLS one: where it went (path without the query's values),
// its outcome and size. ev is forward's decision (zero when it refused the
// request before deciding).
func (s *Service) recordRequest(ctx context.Context, m *connMeta, r *http.Request, ev Event, status int, up, down int64, took time.Duration) {
	d := verdictData(ev)
	if ev.Kind == "" {
		d["allowed"], d["reason"] = false, "request host does not match the connection's"
	}
	scheme := "http"
	if m.sni != "" {
		scheme = "https"
		d["intercepted"] = true
	}
	d["scheme"], d["method"], d["host"], d["path"] = scheme, r.Method, normHost(hostOnly(r.Host)), r.URL.Path
	if keys := queryKeys(r.URL.RawQuery); len(keys) > 0 {
		d["query_keys"] = keys
	}
	d["dest"], d["status"], d["bytes_up"], d["bytes_down"], d["duration_ms"] = m.od.String(), status, up, down, took.Milliseconds()
	s.recorder().Network(context.WithoutCancel(ctx), m.sb.id, m.sb.workspace, protocol.EventNetworkHTTP, time.Now().Add(-took), d)
}

// queryKeys is the names of a raw query's parameters, sorted, each once:
// values may carry tokens and are never recorded.
func queryKeys(raw string) []string {
	var keys []string
	for part := range strings.SplitSeq(raw, "&") {
		k, _, _ := strings.Cut(part, "=")
		if k != "" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// recordConn records a TLS connection the proxy spliced (or refused) by
// its SNI, from its decision ev until now.
func (s *Service) recordConn(sb *sandbox, ev Event, up, down int64) {
	d := verdictData(ev)
	d["host"], d["dest"], d["bytes_up"], d["bytes_down"], d["duration_ms"] = ev.Host, ev.Dest, up, down, time.Since(ev.Time).Milliseconds()
	s.recorder().Network(context.Background(), sb.id, sb.workspace, protocol.EventNetworkTLS, ev.Time, d)
}

// recordDNS records a query to the daemon's resolver with the answer it
// got (nil when none was written).
func (s *Service) recordDNS(sb *sandbox, ev Event, resp *dns.Msg) {
	d := verdictData(ev)
	d["name"], d["type"] = ev.Host, ev.Type
	if resp != nil {
		d["rcode"] = dns.RcodeToString[resp.Rcode]
		if ans := answers(resp); len(ans) > 0 {
			d["answers"] = ans
		}
	}
	s.recorder().Network(context.Background(), sb.id, sb.workspace, protocol.EventNetworkDNS, ev.Time, d)
}

// answers is the addresses and names a response's answer section holds.
func answers(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		case *dns.CNAME:
			out = append(out, normHost(v.Target))
		}
	}
	return out
}

// answerWriter keeps the response a DNS handler wrote, for the record.
type answerWriter struct {
	dns.ResponseWriter
	msg *dns.Msg
}

func (w *answerWriter) WriteMsg(m *dns.Msg) error {
	w.msg = m
	return w.ResponseWriter.WriteMsg(m)
}

// RecordFlow records a sandbox's TCP or UDP flow that bypassed the proxy
// (network.Manager.WatchFlows), attributed by its source address; flows
// of an address no attached sandbox holds are ignored.
func (s *Service) RecordFlow(f network.Flow) {
	sb := s.bySource(f.Src.Addr())
	if sb == nil {
		return
	}
	d := map[string]any{"protocol": f.Proto, "dest": f.Dst.Addr().String(), "port": f.Dst.Port(),
		"src_port": f.Src.Port(), "bytes_up": f.BytesUp, "bytes_down": f.BytesDown,
		"packets_up": f.PacketsUp, "packets_down": f.PacketsDown, "duration_ms": f.Duration.Milliseconds()}
	if !f.Start.IsZero() {
		d["started"] = f.Start.UTC()
	}
	s.recorder().Network(context.Background(), sb.id, sb.workspace, protocol.EventNetworkFlow, f.Start, d)
}

// relayBuffer is the size of the buffers HTTP bodies are relayed with
// (ReverseProxy's default is 32 KiB).
const relayBuffer = 256 << 10

// relayBuffers pools the body relay buffers of every request.
var relayBuffers httputil.BufferPool = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, relayBuffer); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(p []byte) { b.p.Put(&p) }

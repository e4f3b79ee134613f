package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP trace receiver: it decodes the protobuf
// export requests the daemon's exporter sends and keeps their spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
		http.Error(w, "bad export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(resp)
}

// trace returns the received spans of trace id (hex), by name.
func (o *otlpReceiver) trace(id string) map[string]*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]*tracepb.Span{}
	for _, s := range o.spans {
		if hex.EncodeToString(s.TraceId) == id {
			out[s.Name] = s
		}
	}
	return out
}

func spanAttr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

// request sends method path (absolute URL) with the admin key, a W3C
// traceparent for trace id tid, and a JSON body.
func tracedRequest(t *testing.T, method, url, tid string, body any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(method, url, bytes.NewReader(b))
	req.Header.Set("X-Api-Key", testKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+tid+"-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// scrape GETs url with key (none if "") and parses the Prometheus text.
func scrape(t testing.TB, url, key string) (int, map[string]*dto.MetricFamily) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("X-Api-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return resp.StatusCode, nil
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return 200, fams
}

// sample returns the metric of family name whose labels include want,
// or nil.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
next:
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

// TestTelemetry drives one sandbox through the real daemon, per runtime,
// and checks what /metrics (both listeners), the stats API and CLI, and
// the OTLP traces say about it.
func TestTelemetry(t *testing.T) {
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) { testTelemetry(t, rt) })
	}
}

func testTelemetry(t *testing.T, rt string) {
	recv := &otlpReceiver{}
	otlp := httptest.NewServer(recv)
	defer otlp.Close()
	in := newInternet(t)
	metricsAddr := freePort(t)
	d := startDaemonEnv(t, rt, "", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.URL, "OTEL_BSP_SCHEDULE_DELAY=100"},
		"--metrics-listen", metricsAddr, "--egress-resolve", "allowed.test="+in.addr(0), "--egress-resolve", "denied.test="+in.addr(1))
	sn := readySnapshot(t, d.Client, "tele", testImage(t))

	const createTrace, execTrace = "4bf92f3577b34da6a3ce929d0e0e4736", "5cf92f3577b34da6a3ce929d0e0e4737"
	code, body := tracedRequest(t, "POST", d.Endpoint+"/v2/sandboxes/boxes", createTrace,
		protocol.CreateSandboxRequest{SnapshotID: sn.ID, Name: "tele-box", Timeout: int64p(90),
			ProxyConfig: json.RawMessage(`{"access_control":{"allow_list":["allowed.test"]}}`)})
	var sb protocol.Sandbox
	if err := json.Unmarshal(body, &sb); code != 201 || err != nil || sb.Status != protocol.StatusReady {
		t.Fatalf("create: %d %s", code, body)
	}
	// Commands over the HTTP dataplane (traced) and over WebSocket: the
	// upload's chmod, two egress requests (one allowed, one denied) and
	// some CPU work.
	code, body = tracedRequest(t, "POST", d.Endpoint+"/dp/"+sb.ID+"/execute", execTrace, protocol.ExecuteRequest{Command: "echo hi"})
	if code != 200 || !strings.Contains(string(body), "hi") {
		t.Fatalf("execute: %d %s", code, body)
	}
	(&egressEnv{d: d, in: in}).upload(t, sb.Name)
	allowed(t, d.Client, sb.Name, wgetName("allowed.test", in.addr(0)), "host=allowed.test")
	deniedFast(t, d.Client, sb.Name, wgetName("denied.test", in.addr(1)), "403")
	mustRun(t, d.Client, sb.Name, "head -c 1000000 /dev/zero | md5sum >/dev/null")
	const commands = 5

	t.Run("metrics", func(t *testing.T) {
		if code, _ := scrape(t, d.Endpoint+"/metrics", ""); code != http.StatusUnauthorized {
			t.Errorf("/metrics without a key: %d, want 401", code)
		}
		if code, _ := scrape(t, d.Endpoint+"/metrics", memberKey(t, d, "metrics-member")); code != http.StatusForbidden {
			t.Errorf("/metrics with a member key: %d, want 403", code)
		}
		if code, _ := scrape(t, d.Endpoint+"/metrics", testKey); code != 200 {
			t.Errorf("/metrics with the admin key: %d, want 200", code)
		}
		_, fams := scrape(t, "http://"+metricsAddr+"/metrics", "")
		if fams == nil {
			t.Fatal("--metrics-listen: no metrics")
		}
		var execs float64
		for _, m := range fams["cubicle_exec_total"].GetMetric() {
			execs += m.GetCounter().GetValue()
		}
		if execs != commands {
			t.Errorf("cubicle_exec_total = %v, want %d", execs, commands)
		}
		if m := sample(fams, "cubicle_exec_duration_seconds", map[string]string{"transport": "ws"}); m.GetHistogram().GetSampleCount() != commands-1 {
			t.Errorf("ws exec duration count = %v, want %d", m.GetHistogram().GetSampleCount(), commands-1)
		}
		for verdict, want := range map[string]float64{"allowed": 1, "denied": 1} {
			if m := sample(fams, "cubicle_egress_requests_total", map[string]string{"kind": "http", "verdict": verdict}); m.GetCounter().GetValue() != want {
				t.Errorf("egress http %s = %v, want %v", verdict, m.GetCounter().GetValue(), want)
			}
		}
		if m := sample(fams, "cubicle_egress_bytes_total", map[string]string{"direction": "down"}); m.GetCounter().GetValue() <= 0 {
			t.Errorf("egress bytes down = %v, want > 0", m.GetCounter().GetValue())
		}
		if m := sample(fams, "cubicle_sandboxes", map[string]string{"state": "ready", "runtime": rt}); m.GetGauge().GetValue() != 1 {
			t.Errorf("cubicle_sandboxes{state=ready} = %v, want 1", m.GetGauge().GetValue())
		}
		for _, phase := range []string{"rootfs", "network", "driver", "agent", "total"} {
			m := sample(fams, "cubicle_sandbox_operation_duration_seconds", map[string]string{"op": "create", "phase": phase})
			if m.GetHistogram().GetSampleCount() != 1 {
				t.Errorf("create %s histogram count = %v, want 1", phase, m.GetHistogram().GetSampleCount())
			}
		}
		if m := sample(fams, "cubicle_sandbox_cpu_seconds_total", map[string]string{"sandbox": sb.ID}); m.GetCounter().GetValue() <= 0 {
			t.Errorf("cpu seconds of %s = %v, want > 0", sb.ID, m.GetCounter().GetValue())
		}
		if m := sample(fams, "cubicle_sandbox_memory_bytes", map[string]string{"sandbox": sb.ID}); m.GetGauge().GetValue() <= 0 {
			t.Errorf("memory of %s = %v, want > 0", sb.ID, m.GetGauge().GetValue())
		}
		if m := sample(fams, "cubicle_http_requests_total", map[string]string{"route": "POST /v2/sandboxes/boxes", "code": "201"}); m.GetCounter().GetValue() != 1 {
			t.Errorf("create requests = %v, want 1", m.GetCounter().GetValue())
		}
		if m := sample(fams, "cubicle_store_size_bytes", nil); m.GetGauge().GetValue() <= 0 {
			t.Errorf("store size = %v, want > 0", m.GetGauge().GetValue())
		}
	})

	t.Run("stats", func(t *testing.T) {
		st, err := d.Client.SandboxStats(context.Background(), sb.Name)
		if err != nil || st.ID != sb.ID || st.CPUSeconds <= 0 || st.MemoryBytes <= 0 || st.NetRxBytes < 0 {
			t.Fatalf("stats: %+v %v", st, err)
		}
		bin, _ := binaries(t)
		cmd := exec.Command(bin, "sandbox", "stats", sb.Name)
		cmd.Env = append(os.Environ(), "CUBICLE_ENDPOINT="+d.Endpoint, "CUBICLE_API_KEY="+testKey)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tele-box") || !strings.Contains(string(out), "%") {
			t.Fatalf("cubicle sandbox stats: %v\n%s", err, out)
		}
	})

	t.Run("traces", func(t *testing.T) {
		var create, exec map[string]*tracepb.Span
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			create, exec = recv.trace(createTrace), recv.trace(execTrace)
			if create["boot.agent"] != nil && exec["exec"] != nil {
				break
			}
		}
		server := create["POST /v2/sandboxes/boxes"]
		if server == nil || hex.EncodeToString(server.ParentSpanId) != "00f067aa0ba902b7" || spanAttr(server, "cubicle.workspace") == "" {
			t.Fatalf("create trace has no server span continuing the caller's: %v", names(create))
		}
		op := create["sandbox.create"]
		if op == nil || spanAttr(op, "cubicle.sandbox.id") != sb.ID {
			t.Fatalf("create trace has no sandbox.create span for %s: %v", sb.ID, names(create))
		}
		for _, phase := range []string{"rootfs", "network", "egress", "driver", "agent"} {
			if s := create["boot."+phase]; s == nil || !bytes.Equal(s.ParentSpanId, op.SpanId) {
				t.Errorf("boot.%s is not a child of sandbox.create: %v", phase, names(create))
			}
		}
		e := exec["exec"]
		if e == nil || spanAttr(e, "cubicle.sandbox.id") != sb.ID || spanAttr(e, "cubicle.command.id") == "" {
			t.Fatalf("exec trace has no exec span with the sandbox and command ids: %v", names(exec))
		}
		if dp := exec["POST /dp/{id}/execute"]; dp == nil || !bytes.Equal(e.ParentSpanId, dp.SpanId) {
			t.Fatalf("exec span is not a child of the dataplane request's: %v", names(exec))
		}
	})
}

func names(spans map[string]*tracepb.Span) []string {
	var out []string
	for n := range spans {
		out = append(out, n)
	}
	return out
}

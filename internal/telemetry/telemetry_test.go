package telemetry

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/health"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	dto "github.com/prometheus/client_model/go"
)

// gather returns the registry's families by name.
func gather(t *testing.T, tel *Telemetry) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := tel.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func labels(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(parts, ",")
}

// values maps each metric of family name, by its labels, to its value.
func values(fams map[string]*dto.MetricFamily, name string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range fams[name].GetMetric() {
		switch {
		case m.Gauge != nil:
			out[labels(m)] = m.GetGauge().GetValue()
		case m.Counter != nil:
			out[labels(m)] = m.GetCounter().GetValue()
		case m.Histogram != nil:
			out[labels(m)] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

func TestSandboxCollector(t *testing.T) {
	tel := Discard()
	now := time.Now()
	tel.WatchSandboxes(func(context.Context) ([]protocol.SandboxStats, error) {
		return []protocol.SandboxStats{
			{ID: "a", Status: "ready", Runtime: "gvisor", SampledAt: now, CPUSeconds: 2.5, MemoryBytes: 100, DiskBytes: 7, NetRxBytes: 3, NetTxBytes: 4},
			{ID: "b", Status: "ready", Runtime: "gvisor", SampledAt: now}, // not measured: no series
			{ID: "c", Status: "stopped", Runtime: "namespace", SampledAt: now, DiskBytes: -1},
		}, nil
	})
	fams := gather(t, tel)
	if got := values(fams, "cubicle_sandboxes"); got["runtime=gvisor,state=ready"] != 2 || got["runtime=namespace,state=stopped"] != 1 || len(got) != 2 {
		t.Errorf("cubicle_sandboxes = %v", got)
	}
	for name, want := range map[string]float64{"cubicle_sandbox_cpu_seconds_total": 2.5, "cubicle_sandbox_memory_bytes": 100,
		"cubicle_sandbox_disk_bytes": 7, "cubicle_sandbox_network_receive_bytes_total": 3, "cubicle_sandbox_network_transmit_bytes_total": 4} {
		if got := values(fams, name); len(got) != 1 || got["sandbox=a"] != want {
			t.Errorf("%s = %v, want only sandbox=a: %v", name, got, want)
		}
	}
	broken := Discard()
	broken.WatchSandboxes(func(context.Context) ([]protocol.SandboxStats, error) { return nil, errors.New("store down") })
	if _, err := broken.Registry().Gather(); err == nil {
		t.Error("a failing census: Gather did not report it")
	}
}

func TestObserverAndExecMetrics(t *testing.T) {
	tel := Discard()
	ctx, end := tel.Begin(context.Background(), "create", "sb1")
	t0 := time.Now()
	tel.Phase(ctx, "create", "rootfs", t0, t0.Add(time.Millisecond))
	end(nil)
	_, end = tel.Begin(context.Background(), "stop", "sb1")
	end(errors.New("boom"))
	_, done := tel.Exec(context.Background(), "http", "sb1", "cmd1")
	if got := values(gather(t, tel), "cubicle_exec_active_streams"); got[""] != 1 {
		t.Errorf("active streams during an exec = %v, want 1", got)
	}
	done(0, nil)
	tel.Egress("tls", false)
	tel.EgressBytes(10, 20)
	tel.ImagePull(300, nil)
	fams := gather(t, tel)
	checks := map[string]map[string]float64{
		"cubicle_sandbox_operation_duration_seconds": {"op=create,phase=rootfs": 1, "op=create,phase=total": 1, "op=stop,phase=total": 1},
		"cubicle_sandbox_operation_errors_total":     {"op=stop": 1},
		"cubicle_exec_total":                         {"transport=http": 1},
		"cubicle_exec_duration_seconds":              {"transport=http": 1},
		"cubicle_exec_active_streams":                {"": 0},
		"cubicle_egress_requests_total":              {"kind=tls,verdict=denied": 1},
		"cubicle_egress_bytes_total":                 {"direction=up": 10, "direction=down": 20},
		"cubicle_image_pulls_total":                  {"result=ok": 1},
		"cubicle_image_pull_bytes_total":             {"": 300},
	}
	for name, want := range checks {
		got := values(fams, name)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s{%s} = %v, want %v (all %v)", name, k, got[k], v, got)
			}
		}
	}
}

func TestStoreFileSize(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "cubicle.db")
	os.WriteFile(db, make([]byte, 100), 0o600)
	os.WriteFile(db+"-wal", make([]byte, 50), 0o600)
	tel := Discard()
	tel.WatchStoreFile(db)
	if got := values(gather(t, tel), "cubicle_store_size_bytes"); got[""] != 150 {
		t.Fatalf("store size = %v, want 150", got)
	}
}

func TestTracingOnlyWithAnEndpoint(t *testing.T) {
	for env, want := range map[string]bool{
		"":                                       false,
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://x:1": true,
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://x:1/v1/traces":          true,
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://x:1,OTEL_TRACES_EXPORTER=none": false,
	} {
		vars := map[string]string{}
		for _, kv := range strings.Split(env, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				vars[k] = v
			}
		}
		tel, err := New(context.Background(), WithGetenv(func(k string) string { return vars[k] }))
		if err != nil {
			t.Fatal(err)
		}
		if tel.Tracing() != want {
			t.Errorf("env %q: tracing %v, want %v", env, tel.Tracing(), want)
		}
		tel.Shutdown(context.Background())
	}
}

func TestLogsCarryRequestAndSandbox(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewTextHandler(&buf, nil)))
	tel := Discard()
	mux := http.NewServeMux()
	mux.Handle("POST /dp/{id}/execute", tel.Middleware("POST /dp/{id}/execute", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.InfoContext(r.Context(), "in handler")
		log.InfoContext(r.Context(), "names its own", "sandbox", "other")
		w.WriteHeader(http.StatusTeapot)
	})))
	req := httptest.NewRequest("POST", "/dp/sb-42/execute", nil)
	req.Header.Set(RequestIDHeader, "req-7")
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "request_id=req-7") || !strings.Contains(lines[0], "sandbox=sb-42") {
		t.Fatalf("log %q: first line lacks the request and sandbox ids", buf.String())
	}
	if strings.Count(lines[1], "sandbox=") != 1 || !strings.Contains(lines[1], "sandbox=other") {
		t.Errorf("a record naming its own sandbox got %q", lines[1])
	}
	if got := values(gather(t, tel), "cubicle_http_requests_total"); got["code=418,route=POST /dp/{id}/execute"] != 1 {
		t.Errorf("requests = %v, want one 418", got)
	}
}

func TestHealthCollector(t *testing.T) {
	tel := Discard()
	checks := health.New(
		health.Check{Name: "store", Critical: true, Probe: func(context.Context) error { return nil }},
		health.Check{Name: "egress_proxy", Probe: func(context.Context) error { return errors.New("down") }},
	)
	tel.WatchHealth(checks, func() (protocol.StoreSpace, error) {
		return protocol.StoreSpace{
			Store:    protocol.FSSpace{Total: 100, Used: 40, Free: 60},
			Host:     &protocol.FSSpace{Total: 1000, Used: 990, Free: 10},
			Usable:   10,
			Metadata: &protocol.MetadataSpace{Total: 50, Used: 20, Free: 25, Unallocated: 30, Reserve: 16},
		}, nil
	})
	fams := gather(t, tel)
	if got := values(fams, "cubicle_health_ok"); got["check=store"] != 1 || got["check=egress_proxy"] != 0 || len(got) != 2 {
		t.Errorf("cubicle_health_ok = %v", got)
	}
	got := values(fams, "cubicle_store_space_bytes")
	for k, want := range map[string]float64{"fs=store,kind=free": 60, "fs=store,kind=total": 100, "fs=host,kind=used": 990, "fs=host,kind=free": 10} {
		if got[k] != want {
			t.Errorf("cubicle_store_space_bytes{%s} = %v, want %v (all: %v)", k, got[k], want, got)
		}
	}
	if u := values(fams, "cubicle_store_usable_bytes"); u[""] != 10 {
		t.Errorf("cubicle_store_usable_bytes = %v", u)
	}
	meta := values(fams, "cubicle_store_metadata_bytes")
	for k, want := range map[string]float64{"kind=total": 50, "kind=used": 20, "kind=free": 25, "kind=unallocated": 30, "kind=reserve": 16} {
		if meta[k] != want {
			t.Errorf("cubicle_store_metadata_bytes{%s} = %v, want %v", k, meta[k], want)
		}
	}
}

func TestPoolMetrics(t *testing.T) {
	tel := Discard()
	var _ sandbox.PoolObserver = tel
	tel.PoolClaim("sn1", true)
	tel.PoolClaim("sn1", true)
	tel.PoolClaim("sn1", false)
	tel.PoolClaimed(3 * time.Millisecond)
	tel.PoolSize("sn1", 4)
	fams := gather(t, tel)
	checks := map[string]map[string]float64{
		"cubicle_pool_claims_total":           {"result=hit,snapshot=sn1": 2, "result=miss,snapshot=sn1": 1},
		"cubicle_pool_claim_duration_seconds": {"": 1},
		"cubicle_pool_ready_instances":        {"snapshot=sn1": 4},
	}
	for name, want := range checks {
		got := values(fams, name)
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s{%s} = %v, want %v (all %v)", name, k, got[k], v, got)
			}
		}
	}
}

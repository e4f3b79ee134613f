package api

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/telemetry"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func TestMetricsNeedAnAdminKey(t *testing.T) {
	tel := telemetry.Discard()
	ta := newTestAPI(t, false)
	ta.srv = New(ta.mgr, fakeAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler), WithTelemetry(tel))
	for key, want := range map[string]int{"": http.StatusUnauthorized, memberKey: http.StatusForbidden, adminKey: http.StatusOK} {
		if code, _ := ta.do(t, "GET", "/metrics", key, nil); code != want {
			t.Errorf("GET /metrics with key %q: %d, want %d", key, code, want)
		}
	}
	// The two requests before the admin's are counted by route and status.
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("X-Api-Key", adminKey)
	rec := httptest.NewRecorder()
	ta.srv.ServeHTTP(rec, req)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, m := range fams["cubicle_http_requests_total"].GetMetric() {
		var route, code string
		for _, l := range m.GetLabel() {
			switch l.GetName() {
			case "route":
				route = l.GetValue()
			case "code":
				code = l.GetValue()
			}
		}
		got[route+" "+code] = m.GetCounter().GetValue()
	}
	for k, want := range map[string]float64{"GET /metrics 401": 1, "GET /metrics 403": 1, "GET /metrics 200": 1} {
		if got[k] != want {
			t.Errorf("cubicle_http_requests_total{%s} = %v, want %v (all: %v)", k, got[k], want, got)
		}
	}
}

// instanceAuth authenticates every key as an instance admin without the
// admin role in its workspace.
type instanceAuth struct{}

func (instanceAuth) Authenticate(context.Context, string) (auth.Principal, error) {
	return auth.Principal{WorkspaceID: "w1", User: "root", Role: store.RoleMember, InstanceAdmin: true}, nil
}

func TestMetricsAdmitTheInstanceAdmin(t *testing.T) {
	ta := newTestAPI(t, false)
	ta.srv = New(ta.mgr, instanceAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler))
	if code, _ := ta.do(t, "GET", "/metrics", "any", nil); code != http.StatusOK {
		t.Fatalf("GET /metrics as the instance admin: %d, want 200", code)
	}
}

func TestRequestIDEchoedOrMinted(t *testing.T) {
	ta := newTestAPI(t, false)
	for in, keep := range map[string]bool{"caller-id.42": true, "": false, "bad id\n": false, strings.Repeat("x", 200): false} {
		req := httptest.NewRequest("GET", "/v2/sandboxes/boxes/bobs", nil)
		req.Header.Set("X-Api-Key", memberKey)
		req.Header.Set(telemetry.RequestIDHeader, in)
		rec := httptest.NewRecorder()
		ta.srv.ServeHTTP(rec, req)
		got := rec.Header().Get(telemetry.RequestIDHeader)
		if keep && got != in || !keep && (got == "" || got == in) {
			t.Errorf("X-Request-Id %q: response has %q", in, got)
		}
	}
}

func TestStatsRoutesFollowVisibility(t *testing.T) {
	ta := newTestAPI(t, false)
	if code, body := ta.do(t, "GET", "/v2/sandboxes/boxes/bobs/stats", memberKey, nil); code != 200 || field(body, "cpu_seconds") != 2.0 {
		t.Fatalf("own stats: %d %v", code, body)
	}
	if code, _ := ta.do(t, "GET", "/v2/sandboxes/boxes/anns/stats", memberKey, nil); code != 404 {
		t.Fatalf("another member's stats: %d, want 404", code)
	}
	code, body := ta.do(t, "GET", "/v2/sandboxes/stats", memberKey, nil)
	if list, _ := field(body, "sandboxes").([]any); code != 200 || len(list) != 1 {
		t.Fatalf("member's stats list: %d %v, want only bobs", code, body)
	}
	code, body = ta.do(t, "GET", "/v2/sandboxes/stats", adminKey, nil)
	if list, _ := field(body, "sandboxes").([]any); code != 200 || len(list) != 2 {
		t.Fatalf("admin's stats list: %d %v, want both", code, body)
	}
}

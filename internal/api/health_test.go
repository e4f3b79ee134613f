package api

import (
	"context"
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/health"
)

// TestHealthz: /healthz tells ok, degraded (200, with the reason) and
// unavailable (503) apart, and while unavailable a create is refused with
// 503 and the reason, not attempted.
func TestHealthz(t *testing.T) {
	ta := newTestAPI(t, false)
	var storeErr, proxyErr error
	ta.srv.health = health.New(
		health.Check{Name: "store", Critical: true, Probe: func(context.Context) error { return storeErr }},
		health.Check{Name: "egress_proxy", Probe: func(context.Context) error { return proxyErr }},
	)
	check := func(wantCode int, wantStatus string) map[string]any {
		t.Helper()
		code, body := ta.do(t, "GET", "/healthz", "", nil)
		m, _ := body.(map[string]any)
		if code != wantCode || m["status"] != wantStatus || m["ok"] != (wantStatus == health.StatusOK) {
			t.Fatalf("healthz = %d %v, want %d %s", code, body, wantCode, wantStatus)
		}
		return m
	}
	create := func() (int, any) {
		// Recent caches for gateAge: a fresh Run makes the gate see now.
		ta.srv.health.Run(context.Background())
		return ta.do(t, "POST", "/v2/sandboxes/boxes", memberKey, map[string]any{"name": "b1"})
	}

	check(200, health.StatusOK)
	if code, body := create(); code != 201 {
		t.Fatalf("create while healthy = %d %v", code, body)
	}

	proxyErr = errors.New("listener closed")
	m := check(200, health.StatusDegraded)
	if r, _ := m["reasons"].([]any); len(r) != 1 || r[0] != "egress_proxy: listener closed" {
		t.Fatalf("degraded reasons %v", m["reasons"])
	}

	storeErr = errors.New("copy-on-write store is read-only")
	check(503, health.StatusUnavailable)
	before := len(ta.mgr.calls)
	code, body := create()
	if code != 503 || detailError(body) != "ServiceUnavailable" {
		t.Fatalf("create while unavailable = %d %v, want 503 ServiceUnavailable", code, body)
	}
	if len(ta.mgr.calls) != before {
		t.Fatal("a refused create reached the manager")
	}

	storeErr, proxyErr = nil, nil
	check(200, health.StatusOK)
	if code, body := create(); code != 201 {
		t.Fatalf("create after recovery = %d %v", code, body)
	}
}

// TestLeftoversRoutes: only the instance admin sees and cleans leftovers
// (they span every workspace); a workspace admin gets 403.
func TestLeftoversRoutes(t *testing.T) {
	ta, _, _ := newQuotaAPI(t) // its authenticator knows the instance key
	for _, key := range []string{adminKey, memberKey} {
		if code, _ := ta.do(t, "GET", "/v2/sandboxes/admin/leftovers", key, nil); code != 403 {
			t.Fatalf("leftovers as %s = %d, want 403", key, code)
		}
		if code, _ := ta.do(t, "POST", "/v2/sandboxes/admin/leftovers/clean", key, nil); code != 403 {
			t.Fatalf("clean as %s = %d, want 403", key, code)
		}
	}
	if len(ta.mgr.calls) != 0 {
		t.Fatalf("refused calls reached the manager: %v", ta.mgr.calls)
	}
	code, body := ta.do(t, "GET", "/v2/sandboxes/admin/leftovers", instanceKey, nil)
	l, _ := body.(map[string]any)["leftovers"].([]any)
	if code != 200 || len(l) != 1 {
		t.Fatalf("leftovers as the instance admin = %d %v", code, body)
	}
	if code, _ := ta.do(t, "POST", "/v2/sandboxes/admin/leftovers/clean", instanceKey, nil); code != 200 || len(ta.mgr.calls) != 1 {
		t.Fatalf("clean as the instance admin = %d, calls %v", code, ta.mgr.calls)
	}
}

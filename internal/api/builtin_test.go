package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// TestRetryableErrorWire: a create that needs the built-in default while
// it builds is a 503 NotReady with Retry-After, not the 400 of a snapshot
// that is not ready for good; one the host has no capacity for (boot
// queue full, memory, store space) is a 503 HostAtCapacity with
// Retry-After, not a 500 or a silent timeout.
func TestRetryableErrorWire(t *testing.T) {
	for _, c := range []struct {
		err         error
		retry, want string
	}{
		{&errdefs.PendingError{Msg: "snapshot default is still being built", RetryAfter: 10 * time.Second}, "10", `"error":"NotReady"`},
		{&errdefs.CapacityError{Msg: "130 boots running or waiting", RetryAfter: 1500 * time.Millisecond}, "2", `"error":"HostAtCapacity"`},
	} {
		ta := newTestAPI(t, false)
		ta.mgr.fail = c.err
		req := httptest.NewRequest("POST", "/v2/sandboxes/boxes", nil)
		req.Header.Set("X-Api-Key", memberKey)
		rec := httptest.NewRecorder()
		ta.srv.ServeHTTP(rec, req)
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != c.retry {
			t.Fatalf("%v: status %d, Retry-After %q", c.err, rec.Code, rec.Header().Get("Retry-After"))
		}
		if got := rec.Body.String(); !strings.Contains(got, c.want) || !strings.Contains(got, c.err.Error()) {
			t.Fatalf("%v: body %s", c.err, got)
		}
	}
}

// TestBuiltinSnapshotJSON: a built-in snapshot says so, with its build's
// progress while building and its packages once built.
func TestBuiltinSnapshotJSON(t *testing.T) {
	s := &Server{}
	v := &sandbox.SnapshotView{Snapshot: &store.Snapshot{ID: "b1", Name: "default", WorkspaceID: store.BuiltinWorkspace,
		Status: "building", Packages: map[string]string{"python3": "3.11.2-1+b1"}}, BuildStep: "installing packages", BuildPercent: 61}
	b, err := json.Marshal(s.snapshotJSON(v))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"builtin":true`, `"build_step":"installing packages"`, `"build_percent":61`, `"packages":{"python3":"3.11.2-1+b1"}`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("snapshot JSON lacks %s: %s", want, b)
		}
	}
	own, _ := json.Marshal(s.snapshotJSON(&sandbox.SnapshotView{Snapshot: &store.Snapshot{ID: "s1", WorkspaceID: "w1"}}))
	for _, absent := range []string{"builtin", "build_step", "packages"} {
		if strings.Contains(string(own), absent) {
			t.Errorf("a workspace's snapshot JSON has %s: %s", absent, own)
		}
	}
}

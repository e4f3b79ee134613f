package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Keys of the quota tests' authenticator, on top of fakeAuth's.
const (
	instanceKey = "instance-key"
	otherKey    = "other-admin-key" // an admin of workspace w2
)

type quotaAuth struct{}

func (quotaAuth) Authenticate(ctx context.Context, key string) (auth.Principal, error) {
	switch key {
	case instanceKey:
		return auth.Principal{WorkspaceID: "default", User: "root", Role: store.RoleAdmin, InstanceAdmin: true}, nil
	case otherKey:
		return auth.Principal{WorkspaceID: "w2", User: "eve", Role: store.RoleAdmin}, nil
	}
	return fakeAuth{}.Authenticate(ctx, key)
}

// fakeQuotas keeps quotas by workspace; only w1, w2 and default exist.
type fakeQuotas struct{ q map[string]store.Quota }

func (f *fakeQuotas) exists(ws string) error {
	if ws != "w1" && ws != "w2" && ws != "default" {
		return fmt.Errorf("workspace %s: %w", ws, errdefs.ErrNotFound)
	}
	return nil
}

func (f *fakeQuotas) WorkspaceQuota(_ context.Context, ws string) (store.Quota, error) {
	return f.q[ws], f.exists(ws)
}

func (f *fakeQuotas) SetWorkspaceQuota(_ context.Context, ws string, q store.Quota) error {
	if err := f.exists(ws); err != nil {
		return err
	}
	f.q[ws] = q
	return nil
}

func (f *fakeQuotas) WorkspaceUsage(_ context.Context, ws string) (store.Usage, int64, error) {
	return store.Usage{Sandboxes: 2, VCPUs: 4, MemBytes: 8, StorageBytes: 16, Snapshots: 1}, 99, f.exists(ws)
}

type recordedQuota struct {
	who, ws string
	q       protocol.Quota
}

type fakeQuotaAudit struct{ got []recordedQuota }

func (a *fakeQuotaAudit) QuotaChanged(_ context.Context, p auth.Principal, ws string, q protocol.Quota) {
	a.got = append(a.got, recordedQuota{p.User, ws, q})
}

func newQuotaAPI(t *testing.T, opts ...Option) (*testAPI, *fakeQuotas, *fakeQuotaAudit) {
	ta := &testAPI{mgr: newFakeSandboxes(), images: &fakeImages{}}
	ta.srv = New(ta.mgr, quotaAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler), opts...)
	fq, fa := &fakeQuotas{q: map[string]store.Quota{}}, &fakeQuotaAudit{}
	ta.srv.EnableQuotas(fq, fa)
	return ta, fq, fa
}

func TestQuotaRoutesAuthz(t *testing.T) {
	ta, _, _ := newQuotaAPI(t)
	for _, p := range prefixes {
		for _, path := range []string{"/workspaces/w1/quotas", "/workspaces/w1/usage"} {
			for _, tc := range []struct {
				key  string
				want int
			}{{instanceKey, 200}, {adminKey, 200}, {memberKey, 403}, {otherKey, 404}, {"", 401}} {
				if code, body := ta.do(t, "GET", p+path, tc.key, nil); code != tc.want {
					t.Errorf("GET %s%s as %q = %d %v, want %d", p, path, tc.key, code, body, tc.want)
				}
			}
		}
	}
	if code, _ := ta.do(t, "GET", "/v2/sandboxes/workspaces/nope/quotas", instanceKey, nil); code != 404 {
		t.Errorf("quotas of an unknown workspace: %d", code)
	}
}

func TestPutQuota(t *testing.T) {
	ta, fq, fa := newQuotaAPI(t)
	path := "/api/v2/sandboxes/workspaces/w1/quotas"
	body := map[string]any{"max_sandboxes": 5, "max_vcpus": 8, "max_mem_bytes": nil, "max_storage_bytes": 1 << 30}
	for _, key := range []string{adminKey, memberKey} {
		if code, _ := ta.do(t, "PUT", path, key, body); code != 403 {
			t.Fatalf("PUT as %s = %d, want 403", key, code)
		}
	}
	if code, _ := ta.do(t, "PUT", path, otherKey, body); code != 404 {
		t.Fatalf("PUT by another workspace's admin = %d, want 404", code)
	}
	if len(fq.q) != 0 || len(fa.got) != 0 {
		t.Fatal("a refused PUT changed or recorded something")
	}
	code, got := ta.do(t, "PUT", path, instanceKey, body)
	if code != 200 || field(got, "max_sandboxes") != 5.0 || field(got, "max_mem_bytes") != nil || field(got, "workspace_id") != "w1" {
		t.Fatalf("PUT as instance admin = %d %v", code, got)
	}
	q := fq.q["w1"]
	if *q.MaxSandboxes != 5 || *q.MaxVCPUs != 8 || q.MaxMemBytes != nil || *q.MaxStorageBytes != 1<<30 || q.MaxSnapshots != nil {
		t.Fatalf("stored quota: %+v", q)
	}
	if len(fa.got) != 1 || fa.got[0].who != "root" || fa.got[0].ws != "w1" || *fa.got[0].q.MaxSandboxes != 5 {
		t.Fatalf("audit: %+v", fa.got)
	}
	if code, got := ta.do(t, "GET", path, adminKey, nil); code != 200 || field(got, "max_vcpus") != 8.0 || field(got, "max_snapshots") != nil {
		t.Fatalf("GET after PUT = %d %v", code, got)
	}
	for _, f := range []string{"max_sandboxes", "max_vcpus", "max_mem_bytes", "max_storage_bytes", "max_snapshots"} {
		code, got := ta.do(t, "PUT", path, instanceKey, map[string]any{f: -1})
		if loc, _ := validation(got); code != 422 || loc != "body/"+f {
			t.Errorf("negative %s = %d %v", f, code, got)
		}
	}
	code, got = ta.do(t, "PUT", path, instanceKey, map[string]any{"max_gpus": 1})
	if loc, typ := validation(got); code != 422 || loc != "body/max_gpus" || typ != extraForbidden {
		t.Errorf("unknown member = %d %v", code, got)
	}
	if code, _ := ta.do(t, "PUT", "/v2/sandboxes/workspaces/nope/quotas", instanceKey, body); code != 404 {
		t.Errorf("PUT for an unknown workspace = %d", code)
	}
}

func TestUsageRoute(t *testing.T) {
	ta, _, _ := newQuotaAPI(t)
	code, got := ta.do(t, "GET", "/v2/sandboxes/workspaces/w1/usage", adminKey, nil)
	if code != 200 || field(got, "sandboxes") != 2.0 || field(got, "vcpus") != 4.0 || field(got, "mem_bytes") != 8.0 ||
		field(got, "storage_bytes") != 16.0 || field(got, "snapshots") != 1.0 || field(got, "fs_used_bytes") != 99.0 {
		t.Fatalf("usage = %d %v", code, got)
	}
}

// TestLimitErrorWire: a quota refusal is a 429 with Retry-After and the
// protocol's error body, its message naming the kind.
func TestLimitErrorWire(t *testing.T) {
	ta := newTestAPI(t, false)
	ta.mgr.fail = &errdefs.LimitError{Kind: errdefs.QuotaCPU, Msg: "running vCPUs would be 6", RetryAfter: 1500 * time.Millisecond}
	req := httptest.NewRequest("POST", "/v2/sandboxes/boxes", nil)
	req.Header.Set("X-Api-Key", memberKey)
	rec := httptest.NewRecorder()
	ta.srv.ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" {
		t.Fatalf("status %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	if got := rec.Body.String(); !strings.Contains(got, `"error":"QuotaExceeded"`) || !strings.Contains(got, "cpu limit exceeded: running vCPUs would be 6") {
		t.Fatalf("body %s", got)
	}
}

// TestRateLimit: a key gets its burst, then 429 with a Retry-After of at
// least a second; another key is unaffected; off means no limit.
func TestRateLimit(t *testing.T) {
	ta, _, _ := newQuotaAPI(t, WithRateLimit(RateLimit{PerSecond: 0.5, Burst: 3}))
	get := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/v2/sandboxes/boxes", nil)
		req.Header.Set("X-Api-Key", key)
		rec := httptest.NewRecorder()
		ta.srv.ServeHTTP(rec, req)
		return rec
	}
	for i := range 3 {
		if rec := get(memberKey); rec.Code != 200 {
			t.Fatalf("request %d within burst: %d", i, rec.Code)
		}
	}
	rec := get(memberKey)
	secs, _ := strconv.Atoi(rec.Header().Get("Retry-After"))
	if rec.Code != 429 || secs < 1 || !strings.Contains(rec.Body.String(), `"error":"RateLimited"`) {
		t.Fatalf("over burst: %d, Retry-After %q, %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body.String())
	}
	if rec := get(adminKey); rec.Code != 200 {
		t.Fatalf("another key: %d", rec.Code)
	}
	off, _, _ := newQuotaAPI(t, WithRateLimit(RateLimit{}))
	for i := range 50 {
		if code, _ := off.do(t, "GET", "/v2/sandboxes/boxes", memberKey, nil); code != 200 {
			t.Fatalf("request %d with the limit off: %d", i, code)
		}
	}
}

// TestRateLimiterEvicts: buckets idle for a refill period are dropped.
func TestRateLimiterEvicts(t *testing.T) {
	k := newKeyLimiter(RateLimit{PerSecond: 10, Burst: 10}) // refills in 1 s
	now := time.Now()
	for i := range 1000 {
		k.wait(fmt.Sprint("key", i), now)
	}
	if len(k.buckets) != 1000 {
		t.Fatalf("%d buckets", len(k.buckets))
	}
	k.wait("late", now.Add(2*time.Second))
	if len(k.buckets) != 1 {
		t.Fatalf("%d buckets after every other key idled a refill period", len(k.buckets))
	}
}

package proxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// fakeRecorder keeps the network events it is given.
type fakeRecorder struct {
	mu  sync.Mutex
	evs []recorded
}

type recorded struct {
	sandbox, typ string
	data         map[string]any
}

func (f *fakeRecorder) Network(_ context.Context, sandboxID, _, typ string, _ time.Time, data map[string]any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.evs = append(f.evs, recorded{sandboxID, typ, data})
}

func (f *fakeRecorder) only(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.evs) != 1 {
		t.Fatalf("recorded %d events, want 1: %+v", len(f.evs), f.evs)
	}
	return f.evs[0]
}

// TestPassThroughDecisions checks a sandbox without a proxy_config is
// allowed everything and dialled exactly where it asked (never by the
// name it sent), while a policy with rules or a list still decides by name.
func TestPassThroughDecisions(t *testing.T) {
	od := netip.MustParseAddrPort("198.18.0.2:443")
	open, _ := Parse(nil)
	for _, host := range []string{"", "example.com", "localhost"} {
		target, v := decide(open, host, od)
		if target != "198.18.0.2" || !v.Allowed || v.Reason != ReasonPassThrough {
			t.Fatalf("pass-through %q: target %q verdict %+v", host, target, v)
		}
	}
	if open.Intercepts("example.com") {
		t.Fatal("pass-through intercepts")
	}
	rules, err := Parse([]byte(`{"rules":[{"name":"r","match_hosts":["api.test"],"headers":[{"name":"X","value":"v"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if target, v := decide(rules, "api.test", od); target != "api.test" || v.Reason == ReasonPassThrough {
		t.Fatalf("rules policy: target %q verdict %+v", target, v)
	}
	deny, _ := Parse([]byte(`{"access_control":{"deny_list":["bad.test"]}}`))
	if _, v := decide(deny, "bad.test", od); v.Allowed {
		t.Fatalf("deny list allowed bad.test: %+v", v)
	}
}

func TestQueryKeys(t *testing.T) {
	if got := fmt.Sprint(queryKeys("token=s3cret&b=1&a&b=2&=x")); got != "[a b token]" {
		t.Fatalf("queryKeys = %s", got)
	}
	if queryKeys("") != nil {
		t.Fatal("keys of an empty query")
	}
}

// proxyFor is a Service recording to rec with one sandbox of policy pol,
// whose upstream connections all go to upstream.
func proxyFor(t *testing.T, rec Recorder, pol string, upstream string) (*Service, *sandbox) {
	p, err := Parse([]byte(pol))
	if err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{Meter: nopMeter{}, Recorder: rec}, log: slog.Default()}
	sb := &sandbox{id: "sb1", workspace: "w", transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, upstream)
		}}}
	sb.policy.Store(p)
	return s, sb
}

func serveOne(s *Service, m *connMeta, req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	s.serveHTTP(w, req.WithContext(context.WithValue(req.Context(), metaKey{}, m)))
	return w
}

// TestRequestRecorded sends a plain HTTP request of a pass-through sandbox
// through serveHTTP: the record has its method, host, path without query
// values, status, bytes both ways and the pass-through verdict.
func TestRequestRecorded(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "got %d bytes", len(b))
	}))
	defer up.Close()
	rec := &fakeRecorder{}
	s, sb := proxyFor(t, rec, "", up.Listener.Addr().String())
	req := httptest.NewRequest("POST", "http://files.test/upload/x?token=s3cret&part=1", strings.NewReader(strings.Repeat("u", 100)))
	w := serveOne(s, &connMeta{sb: sb, od: netip.MustParseAddrPort("198.18.0.2:80")}, req)
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	ev := rec.only(t)
	b, _ := json.Marshal(ev.data)
	if ev.typ != protocol.EventNetworkHTTP || ev.sandbox != "sb1" || strings.Contains(string(b), "s3cret") {
		t.Fatalf("event %s %s", ev.typ, b)
	}
	d := ev.data
	if d["method"] != "POST" || d["host"] != "files.test" || d["path"] != "/upload/x" || fmt.Sprint(d["query_keys"]) != "[part token]" ||
		d["status"] != 201 || d["bytes_up"] != int64(100) || d["bytes_down"] != int64(len("got 100 bytes")) ||
		d["allowed"] != true || d["reason"] != ReasonPassThrough || d["dest"] != "198.18.0.2:80" || d["scheme"] != "http" {
		t.Fatalf("event data %s", b)
	}
}

// TestInjectedRuleRecordedByName sends a request of an intercepted TLS
// connection that a rule injects a header into: the upstream gets the
// value, the record names the rule and never holds the value.
func TestInjectedRuleRecordedByName(t *testing.T) {
	const secret = "opaque-value-9d1f"
	var got string
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = r.Header.Get("X-Key") }))
	defer up.Close()
	rec := &fakeRecorder{}
	s, sb := proxyFor(t, rec, `{"rules":[{"name":"api-key","match_hosts":["api.test"],"headers":[{"name":"X-Key","type":"opaque","value":"`+secret+`"}]}]}`,
		up.Listener.Addr().String())
	req := httptest.NewRequest("GET", "https://api.test/v1/models", nil)
	w := serveOne(s, &connMeta{sb: sb, od: netip.MustParseAddrPort("198.18.0.2:443"), sni: "api.test"}, req)
	if w.Code != 200 || got != secret {
		t.Fatalf("status %d, upstream got %q", w.Code, got)
	}
	ev := rec.only(t)
	b, _ := json.Marshal(ev.data)
	if strings.Contains(string(b), secret) || fmt.Sprint(ev.data["rules"]) != "[api-key]" || ev.data["intercepted"] != true || ev.data["scheme"] != "https" {
		t.Fatalf("event data %s", b)
	}
}

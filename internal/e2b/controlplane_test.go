package e2b

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// do sends an E2B control-plane request with key and decodes the answer
// into out (when non-nil), returning the status.
func do(t *testing.T, method, u, key string, body, out any) int {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequestWithContext(t.Context(), method, u, rd)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// TestCreateMapsOntoCubicle: template, timeout (rounded up to the TTL
// granularity; killed after it unless autoPause), metadata, envs and
// egress reach Cubicle's create, and the answer carries what the SDK
// needs: the id, an envd version it accepts and the key as access token.
func TestCreateMapsOntoCubicle(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	var got sandboxCreated
	status := do(t, "POST", srv.URL+"/v2/sandboxes", keyA, map[string]any{
		"templateID": "my-snap", "timeout": 90, "metadata": map[string]string{"k": "v"}, "envVars": map[string]string{"A": "1"},
		"allow_internet_access": false, "network": map[string]any{"allowOut": []string{"example.com"}}, "futureField": 1,
	}, &got)
	if status != http.StatusCreated || got.SandboxID != "box" || got.EnvdVersion != EnvdVersion || got.EnvdAccessToken != keyA {
		t.Fatalf("create = %d %+v", status, got)
	}
	do(t, "POST", srv.URL+"/sandboxes", keyA, map[string]any{"templateID": "base", "autoPause": true}, nil)
	if len(f.creates) != 2 {
		t.Fatalf("%d creates reached Cubicle", len(f.creates))
	}
	c := f.creates[0]
	if c.Snapshot != "my-snap" || *c.IdleTTLSeconds != 120 || *c.DeleteAfterStopSeconds != 60 || *c.PreserveMemoryOnStop ||
		c.Labels["k"] != "v" || c.Labels[onTimeoutLabel] != onKill || c.EnvVars["A"] != "1" || string(c.ProxyConfig) != `{"access_control":{"allow_list":["example.com"]}}` {
		t.Errorf("first create = %+v (proxy %s)", c, c.ProxyConfig)
	}
	c = f.creates[1]
	if c.Snapshot != "" || *c.IdleTTLSeconds != DefaultTimeout || *c.DeleteAfterStopSeconds != 0 || !*c.PreserveMemoryOnStop ||
		c.Labels[onTimeoutLabel] != onPause {
		t.Errorf("autoPause create of base = %+v", c)
	}
	var e apiError
	if s := do(t, "POST", srv.URL+"/sandboxes", keyA, map[string]any{"templateID": "x", "mcp": map[string]any{"a": 1}}, &e); s != 400 || e.Code != 400 {
		t.Errorf("mcp create = %d %+v, want 400", s, e)
	}
	if s := do(t, "POST", srv.URL+"/sandboxes", "", map[string]any{}, &e); s != 401 {
		t.Errorf("create without a key = %d, want 401", s)
	}
}

func TestEgressConfig(t *testing.T) {
	no := false
	for _, tc := range []struct {
		allow *bool
		n     *network
		want  string
	}{
		{nil, nil, ""},
		{&no, nil, `{"access_control":{"allow_list":[]}}`},
		{nil, &network{DenyOut: []string{"0.0.0.0/0"}}, `{"access_control":{"allow_list":[]}}`},
		{nil, &network{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"a.com"}}, `{"access_control":{"allow_list":["a.com"]}}`},
		{nil, &network{DenyOut: []string{"evil.com"}}, `{"access_control":{"deny_list":["evil.com"]}}`},
	} {
		got, err := egressConfig(tc.allow, tc.n)
		if err != nil || string(got) != tc.want {
			t.Errorf("egressConfig(%v, %+v) = %s, %v; want %s", tc.allow, tc.n, got, err, tc.want)
		}
	}
}

// TestSandboxInfoAndErrors: get maps a sandbox onto the SDKs' shape; a
// missing one is 404 and kill of it 404 (the SDKs answer false), as the
// E2B API's {"code","message"} body.
func TestSandboxInfoAndErrors(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	var got listedSandbox
	if s := do(t, "GET", srv.URL+"/sandboxes/box", keyA, nil, &got); s != 200 {
		t.Fatalf("get = %d", s)
	}
	if got.SandboxID != "box" || got.State != stateRunning || got.CPUCount != 2 || got.MemoryMB != 512 || got.DiskSizeMB != 1024 ||
		got.Metadata["suite"] != "unit" || len(got.Metadata) != 1 || !got.EndAt.Equal(got.StartedAt.Add(300*time.Second)) {
		t.Errorf("get = %+v", got)
	}
	var e apiError
	if s := do(t, "GET", srv.URL+"/sandboxes/gone", keyA, nil, &e); s != 404 || e.Code != 404 || e.Message == "" {
		t.Errorf("get of a missing sandbox = %d %+v", s, e)
	}
	if s := do(t, "DELETE", srv.URL+"/sandboxes/gone", keyA, nil, &e); s != 404 {
		t.Errorf("kill of a missing sandbox = %d", s)
	}
}

// TestPauseResumeConnect: pause keeps memory and the sandbox (never
// deleted while paused) and stops; pausing a paused sandbox is 409 (the
// SDKs answer false); connect starts a paused one (201), restoring memory,
// its timeout's action (here autoPause) and the timeout asked for;
// connect to a running one is 200; resume of a running one is 409.
func TestPauseResumeConnect(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	if s := do(t, "POST", srv.URL+"/sandboxes/box/pause", keyA, map[string]any{}, nil); s != 204 {
		t.Fatalf("pause = %d", s)
	}
	if s := do(t, "POST", srv.URL+"/sandboxes/box/pause", keyA, nil, nil); s != 409 {
		t.Errorf("second pause = %d, want 409", s)
	}
	var got sandboxCreated
	if s := do(t, "POST", srv.URL+"/v2/sandboxes/box/connect", keyA, map[string]any{"timeout": 30}, &got); s != 201 || got.SandboxID != "box" {
		t.Errorf("connect to a paused sandbox = %d %+v", s, got)
	}
	if s := do(t, "POST", srv.URL+"/v2/sandboxes/box/connect", keyA, map[string]any{}, nil); s != 200 {
		t.Errorf("connect to a running sandbox = %d", s)
	}
	if s := do(t, "POST", srv.URL+"/sandboxes/box/resume", keyA, map[string]any{}, nil); s != 409 {
		t.Errorf("resume of a running sandbox = %d", s)
	}
	if !slices.Equal(f.calls, []string{"stop box", "start box"}) {
		t.Errorf("lifecycle calls = %q", f.calls)
	}
	if len(f.updates) != 2 || !*f.updates[0].PreserveMemoryOnStop || *f.updates[0].DeleteAfterStopSeconds != 0 ||
		*f.updates[1].IdleTTLSeconds != 60 || !*f.updates[1].PreserveMemoryOnStop || *f.updates[1].DeleteAfterStopSeconds != 0 {
		t.Errorf("updates = %+v", f.updates)
	}
}

// TestLifecycle: a killed-on-timeout sandbox is deleted one TTL unit
// after its idle stop and keeps no memory; autoPause ones are kept.
func TestLifecycle(t *testing.T) {
	d := New(Config{TTLGranularity: time.Second})
	for action, want := range map[string][2]int64{onKill: {0, 1}, "": {0, 1}, onPause: {1, 0}, onPauseFS: {0, 0}} {
		lc := d.lifecycle(action)
		keep := int64(0)
		if *lc.PreserveMemoryOnStop {
			keep = 1
		}
		if keep != want[0] || *lc.DeleteAfterStopSeconds != want[1] {
			t.Errorf("lifecycle(%q) = keep %v delete after %d; want %v", action, keep, *lc.DeleteAfterStopSeconds, want)
		}
	}
}

func TestListOptions(t *testing.T) {
	q := url.Values{"metadata": {"b=2&a%2520c=1"}, "state": {"running,paused"}, "limit": {"5"}, "nextToken": {"cur"}}
	opts, states, err := listOptions(q)
	if err != nil || !slices.Equal(opts.Labels, []string{"a c=1", "b=2"}) || opts.Limit != 5 || opts.Cursor != "cur" ||
		!slices.Equal(states, []string{stateRunning, statePaused}) {
		t.Errorf("listOptions = %+v %q %v", opts, states, err)
	}
	for _, bad := range []url.Values{{"state": {"killed"}}, {"limit": {"0"}}} {
		if _, _, err := listOptions(bad); err == nil {
			t.Errorf("listOptions(%v) accepted", bad)
		}
	}
}

func TestE2BState(t *testing.T) {
	for status, want := range map[string]string{protocol.StatusReady: stateRunning, protocol.StatusStopped: statePaused, protocol.StatusFailed: ""} {
		if got := e2bState(status); got != want {
			t.Errorf("e2bState(%q) = %q, want %q", status, got, want)
		}
	}
}

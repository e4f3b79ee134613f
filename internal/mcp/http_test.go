package mcp

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// headerTransport adds a bearer key to every request.
type headerTransport struct {
	key  *string
	next http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+*h.key)
	return h.next.RoundTrip(r)
}

// TestHTTPHandler: a session's tools act with the key that opened it,
// through the Loopback client (WebSocket exec included); a request
// without a key is a 401 and one on the session with another key a 403.
func TestHTTPHandler(t *testing.T) {
	f := newFakeAPI(t)
	loop := NewLoopback()
	api := &http.Server{Handler: f.srv.Config.Handler}
	go func() { _ = api.Serve(loop) }()
	t.Cleanup(func() { api.Close() })
	var mu sync.Mutex
	var keys []string
	h := NewHTTPHandler(func(key string) *cubicle.Client {
		mu.Lock()
		keys = append(keys, key)
		mu.Unlock()
		// The public URL need not be reachable: the loopback carries it.
		return cubicle.New("https://cubicle.invalid", key, cubicle.WithHTTPClient(loop.Client()), cubicle.WithDoor(protocol.DoorMCP))
	}, nil)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	t.Cleanup(h.Close)

	resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", resp.StatusCode)
	}

	key := testKey
	hc := &http.Client{Transport: headerTransport{key: &key, next: http.DefaultTransport}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(),
		&mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call[SandboxInfo](t, cs, "create_sandbox", map[string]any{"name": "box"})
	out := call[CommandOutput](t, cs, "run_command", map[string]any{"sandbox": "box", "command": "echo over the loopback"})
	if out.Stdout != "over the loopback\n" {
		t.Errorf("run_command over HTTP = %+v", out)
	}
	mu.Lock()
	for _, k := range keys {
		if k != testKey {
			t.Errorf("a client built for key %q, want only the session's", k)
		}
	}
	mu.Unlock()

	key = "someone-else"
	if e := callErr(t, cs, "list_sandboxes", nil); !strings.Contains(e, "403") && !strings.Contains(strings.ToLower(e), "forbidden") && !strings.Contains(e, "mismatch") {
		t.Errorf("another key on the session: %q, want a refusal", e)
	}
}

// TestLoopbackClosed: once closed, the loopback refuses new connections
// rather than hanging.
func TestLoopbackClosed(t *testing.T) {
	loop := NewLoopback()
	loop.Close()
	if _, err := loop.Accept(); err == nil {
		t.Error("Accept after Close succeeded")
	}
	if _, err := loop.Client().Get("http://x/"); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("a request after Close: %v", err)
	}
}

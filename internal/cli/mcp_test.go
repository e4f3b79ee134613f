package cli

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestMCPCmd: `cubicle mcp` speaks MCP on stdin/stdout and its tools call
// the daemon at CUBICLE_ENDPOINT with CUBICLE_API_KEY through the MCP
// door; an API refusal comes back as a tool error.
func TestMCPCmd(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Api-Key")+" "+r.Header.Get(protocol.DoorHeader))
		mu.Unlock()
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "NotFound", Message: "no such sandbox"}})
	}))
	t.Cleanup(srv.Close)
	t.Setenv(envEndpoint, srv.URL)
	t.Setenv(envAPIKey, "k")

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	cmd := newMCPCmd()
	cmd.SetArgs(nil)
	cmd.SetIn(inR)
	cmd.SetOut(outW)
	cmd.SetErr(io.Discard)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(t.Context()); outW.Close() }()
	lines := bufio.NewScanner(outR)
	lines.Buffer(nil, 1<<20)
	rpc := func(msg string) map[string]any {
		t.Helper()
		if _, err := io.WriteString(inW, msg+"\n"); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(msg, `"id"`) {
			if !lines.Scan() {
				t.Fatalf("no answer to %s: %v", msg, lines.Err())
			}
			var resp map[string]any
			if err := json.Unmarshal(lines.Bytes(), &resp); err != nil {
				t.Fatalf("answer %s: %v", lines.Bytes(), err)
			}
			return resp
		}
		return nil
	}
	init := rpc(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if info, _ := init["result"].(map[string]any)["serverInfo"].(map[string]any); info["name"] != "cubicle" {
		t.Fatalf("initialize: %v", init)
	}
	rpc(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	res := rpc(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_command","arguments":{"sandbox":"box","command":"true"}}}`)
	result, _ := res["result"].(map[string]any)
	if b, _ := json.Marshal(result); result["isError"] != true || !strings.Contains(string(b), "404") {
		t.Errorf("run_command in a missing sandbox: %s", b)
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Errorf("mcp command: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) == 0 || seen[0] != "k mcp" {
		t.Errorf("the daemon saw %q, want the key and the MCP door", seen)
	}
}

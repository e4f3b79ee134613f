package cubicle

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestWithDoor: a client built WithDoor names its door on control-plane,
// dataplane and exec WebSocket requests alike; one built without it sends
// no door header.
func TestWithDoor(t *testing.T) {
	d := newFakeDaemon(t)
	var mu sync.Mutex
	var doors []string
	seen := func(r *http.Request) {
		mu.Lock()
		doors = append(doors, r.URL.Path+" "+r.Header.Get(protocol.DoorHeader))
		mu.Unlock()
	}
	d.mux.HandleFunc("POST /dp/{name}/execute", func(w http.ResponseWriter, r *http.Request) {
		seen(r)
		writeJSON(w, http.StatusOK, protocol.ExecuteResult{ExitCode: 0})
	})
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, _ int) {
		f := readFrame(t, ctx, conn)
		sendFrames(t, ctx, conn, started(f.CommandID), exit(0))
	})
	inner := d.mux
	d.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/dp/box/execute/ws" || r.URL.Path == "/v2/sandboxes/boxes/box" {
			seen(r)
		}
		inner.ServeHTTP(w, r)
	})
	c := New(d.srv.URL, testKey, WithDoor(protocol.DoorMCP))
	if _, err := c.Run(t.Context(), "box", "true"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(t.Context(), "box", ExecRequest{Command: "true"}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(d.srv.URL, testKey).Run(t.Context(), "box", "true"); err != nil {
		t.Fatal(err)
	}
	want := []string{"/v2/sandboxes/boxes/box mcp", "/dp/box/execute mcp", "/dp/box/execute/ws mcp",
		"/v2/sandboxes/boxes/box ", "/dp/box/execute "}
	mu.Lock()
	defer mu.Unlock()
	if len(doors) != len(want) {
		t.Fatalf("requests %q, want %q", doors, want)
	}
	for i := range want {
		if doors[i] != want[i] {
			t.Errorf("request %d: %q, want %q", i, doors[i], want[i])
		}
	}
}

// TestGlobGrep: Glob and Grep post their request to the sandbox's
// dataplane and decode the matches and the truncated flag.
func TestGlobGrep(t *testing.T) {
	d := newFakeDaemon(t)
	d.mux.HandleFunc("POST /dp/{name}/glob", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.GlobRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Pattern != "*.go" || req.Path != "/src" {
			t.Errorf("glob request %+v, %v", req, err)
		}
		writeJSON(w, http.StatusOK, protocol.GlobResult{Matches: []protocol.GlobMatch{{Path: "/src/a.go", SizeBytes: 3}}, Truncated: true})
	})
	d.mux.HandleFunc("POST /dp/{name}/grep", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.GrepRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Pattern != "func" || req.Glob != "*.go" {
			t.Errorf("grep request %+v, %v", req, err)
		}
		writeJSON(w, http.StatusOK, protocol.GrepResult{Matches: []protocol.GrepMatch{{Path: "/src/a.go", Line: 2, Text: "func main() {}"}}})
	})
	c := d.client()
	g, err := c.Glob(t.Context(), "box", protocol.GlobRequest{Pattern: "*.go", Path: "/src"})
	if err != nil || len(g.Matches) != 1 || g.Matches[0].Path != "/src/a.go" || g.Matches[0].SizeBytes != 3 || !g.Truncated {
		t.Errorf("Glob = %+v, %v", g, err)
	}
	r, err := c.Grep(t.Context(), "box", protocol.GrepRequest{Pattern: "func", Path: "/src", Glob: "*.go"})
	if err != nil || len(r.Matches) != 1 || r.Matches[0].Line != 2 || r.Matches[0].Text != "func main() {}" || r.Truncated {
		t.Errorf("Grep = %+v, %v", r, err)
	}
}

// TestReadFileAt: a range read gives the bytes and the file's size, an
// offset past the end gives none, and a server that ignores the range
// still yields the right bytes.
func TestReadFileAt(t *testing.T) {
	d := newFakeDaemon(t)
	content := "0123456789"
	d.mux.HandleFunc("GET /dp/{name}/download", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") == "plain" {
			io.WriteString(w, content) // ignores Range
			return
		}
		http.ServeContent(w, r, "", time.Time{}, strings.NewReader(content))
	})
	c := d.client()
	for _, tc := range []struct {
		box      string
		off, n   int64
		want     string
		wantSize int64
	}{
		{"box", 2, 3, "234", 10},
		{"box", 8, 5, "89", 10},
		{"box", 10, 5, "", 10},
		{"plain", 2, 3, "234", 10}, // its Content-Length
	} {
		b, size, err := c.ReadFileAt(t.Context(), tc.box, "/f", tc.off, tc.n)
		if err != nil || string(b) != tc.want || size != tc.wantSize {
			t.Errorf("%s %d+%d: %q size %d, %v; want %q size %d", tc.box, tc.off, tc.n, b, size, err, tc.want, tc.wantSize)
		}
	}
}

package cubicle

import (
	"context"
	"net/http"
	"testing"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestWithHeaderOnEveryRequest: a door's header rides on control-plane
// calls, dataplane calls and the exec WebSocket handshake alike.
func TestWithHeaderOnEveryRequest(t *testing.T) {
	d := newFakeDaemon(t)
	seen := make(chan string, 4)
	d.mux.HandleFunc("PATCH /v2/sandboxes/boxes/{name}", func(w http.ResponseWriter, r *http.Request) {
		seen <- "patch:" + r.Header.Get("X-Cubicle-Door")
		writeJSON(w, http.StatusOK, protocol.Sandbox{Name: r.PathValue("name"), IdleTTLSeconds: 120})
	})
	d.mux.HandleFunc("POST /dp/{name}/glob", func(w http.ResponseWriter, r *http.Request) {
		seen <- "glob:" + r.Header.Get("X-Cubicle-Door")
		writeJSON(w, http.StatusOK, protocol.GlobResult{Matches: []protocol.GlobMatch{{Path: "/tmp/a", SizeBytes: 3}}})
	})
	d.mux.HandleFunc("GET /dp/{name}/execute/ws", func(w http.ResponseWriter, r *http.Request) {
		seen <- "ws:" + r.Header.Get("X-Cubicle-Door")
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		f := readFrame(t, r.Context(), conn)
		sendFrames(t, r.Context(), conn, started(f.CommandID), exit(0))
	})
	c := New(d.srv.URL, testKey, WithHeader("X-Cubicle-Door", "e2b"))
	ttl := int64(120)
	sb, err := c.UpdateSandbox(t.Context(), "box", protocol.UpdateSandboxRequest{IdleTTLSeconds: &ttl})
	if err != nil || sb.IdleTTLSeconds != 120 {
		t.Fatalf("UpdateSandbox = %+v, %v", sb, err)
	}
	g, err := c.Glob(t.Context(), "box", protocol.GlobRequest{Pattern: "*", Path: "/tmp"})
	if err != nil || len(g.Matches) != 1 || g.Matches[0].Path != "/tmp/a" {
		t.Fatalf("Glob = %+v, %v", g, err)
	}
	if _, err := c.Exec(t.Context(), "box", ExecRequest{Command: "true"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"patch:e2b", "glob:e2b", "ws:e2b"} {
		if got := <-seen; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

// TestExecOnStartAndKill: OnStart gets the server's pid before any output,
// and Kill sends a kill frame and returns the killed command's exit code.
func TestExecOnStartAndKill(t *testing.T) {
	d := newFakeDaemon(t)
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		f := readFrame(t, ctx, conn)
		s := started(f.CommandID)
		s.PID = 4242
		sendFrames(t, ctx, conn, s, out("stdout", "x", 0))
		if k := readFrame(t, ctx, conn); k.Type != protocol.FrameKill {
			t.Errorf("frame after output = %+v, want kill", k)
		}
		sendFrames(t, ctx, conn, exit(137))
	})
	kill := make(chan struct{})
	var pid int
	code, err := d.client().Exec(t.Context(), "box", ExecRequest{
		Command: "sleep 9",
		OnStart: func(p int) { pid = p },
		Kill:    kill,
		Stdout: writerFunc(func(p []byte) (int, error) {
			if pid != 4242 {
				t.Errorf("output before OnStart (pid %d)", pid)
			}
			close(kill)
			return len(p), nil
		}),
	})
	if err != nil || code != 137 {
		t.Fatalf("Exec = %d, %v; want 137, nil", code, err)
	}
}

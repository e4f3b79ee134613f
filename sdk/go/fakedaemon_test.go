package cubicle

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

const testKey = "test-key"

// fakeDaemon is a TEST DOUBLE of the Cubicle daemon: an httptest.Server that
// implements just enough of the protocol for one SDK test at a time. Every
// sandbox exists, is ready and has the dataplane <server>/dp/<name>; tests
// add the routes they exercise. The real daemon is tested end to end under
// test/e2e, not here.
type fakeDaemon struct {
	t   *testing.T
	srv *httptest.Server
	mux *http.ServeMux
}

func newFakeDaemon(t *testing.T) *fakeDaemon {
	t.Helper()
	d := &fakeDaemon{t: t, mux: http.NewServeMux()}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != testKey {
			writeJSON(w, http.StatusUnauthorized, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "Unauthorized", Message: "bad key"}})
			return
		}
		d.mux.ServeHTTP(w, r)
	}))
	t.Cleanup(d.srv.Close)
	d.mux.HandleFunc("GET /v2/sandboxes/boxes/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		writeJSON(w, http.StatusOK, protocol.Sandbox{
			ID: "id-" + name, Name: name, Status: protocol.StatusReady,
			DataplaneURL: d.srv.URL + "/dp/" + name,
		})
	})
	return d
}

// client returns an SDK client for the double with instant polls and
// reconnects.
func (d *fakeDaemon) client() *Client {
	c := New(d.srv.URL, testKey, WithPollInterval(time.Millisecond))
	c.reconnectDelay = func(int) time.Duration { return time.Millisecond }
	return c
}

// handleExec serves the exec WebSocket of every sandbox. fn runs once per
// connection with the 0-based attempt number; returning ends the connection
// abruptly unless fn closed it.
func (d *fakeDaemon) handleExec(fn func(ctx context.Context, conn *websocket.Conn, attempt int)) {
	var attempts atomic.Int32
	d.mux.HandleFunc("GET /dp/{name}/execute/ws", func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			d.t.Errorf("accept: %v", err)
			return
		}
		defer conn.CloseNow()
		fn(r.Context(), conn, int(attempts.Add(1))-1)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// readFrame reads one client frame; a failure is reported and gives a zero
// frame.
func readFrame(t *testing.T, ctx context.Context, conn *websocket.Conn) protocol.ExecFrame {
	t.Helper()
	var f protocol.ExecFrame
	_, b, err := conn.Read(ctx)
	if err != nil {
		t.Errorf("server read: %v", err)
		return f
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Errorf("server decode %q: %v", b, err)
	}
	return f
}

// sendFrames writes server frames in order.
func sendFrames(t *testing.T, ctx context.Context, conn *websocket.Conn, frames ...protocol.ExecFrame) {
	t.Helper()
	for _, f := range frames {
		if err := writeFrame(ctx, conn, f); err != nil {
			t.Errorf("server write %s: %v", f.Type, err)
			return
		}
	}
}

func started(id string) protocol.ExecFrame {
	return protocol.ExecFrame{Type: protocol.FrameStarted, CommandID: id, PID: 42}
}

func out(stream, data string, off int64) protocol.ExecFrame {
	return protocol.ExecFrame{Type: stream, Data: data, Offset: &off}
}

func exit(code int) protocol.ExecFrame {
	return protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &code}
}

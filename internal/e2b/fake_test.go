package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Keys the fake knows: both see sandbox "box" (ready) and "paused-box"
// (stopped), as two members of one workspace would.
const (
	keyA = "key-a"
	keyB = "key-b"
)

// fakeCubicle is a TEST DOUBLE of the Cubicle API: just the routes the
// door calls, with canned sandboxes and an exec that follows a script by
// command. It fails the test on any request that does not carry a known
// key and the e2b door header. The real daemon is tested end to end in
// test/e2e (TestE2BSDK).
type fakeCubicle struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	creates []protocol.CreateSandboxRequest
	updates []protocol.UpdateSandboxRequest
	calls   []string // "METHOD path" of lifecycle calls
	globs   map[string][]protocol.GlobMatch
	files   map[string]string
	status  map[string]string
	// timeouts are the timeout_seconds of each exec's first frame (-1: none sent).
	timeouts []int64
}

func newFakeCubicle(t *testing.T) *fakeCubicle {
	f := &fakeCubicle{t: t, globs: map[string][]protocol.GlobMatch{}, files: map[string]string{},
		status: map[string]string{"box": protocol.StatusReady, "paused-box": protocol.StatusStopped}}
	mux := http.NewServeMux()
	const p = "/v2/sandboxes/boxes"
	mux.HandleFunc("GET "+p+"/{name}", func(w http.ResponseWriter, r *http.Request) {
		if sb, ok := f.sandbox(r.PathValue("name")); ok {
			writeJSON(w, http.StatusOK, sb)
			return
		}
		writeJSON(w, http.StatusNotFound, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "NotFound", Message: "no such sandbox"}})
	})
	mux.HandleFunc("DELETE "+p+"/{name}", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := f.sandbox(r.PathValue("name")); !ok {
			writeJSON(w, http.StatusNotFound, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "NotFound", Message: "no such sandbox"}})
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("POST "+p, func(w http.ResponseWriter, r *http.Request) {
		var req protocol.CreateSandboxRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.creates = append(f.creates, req)
		f.mu.Unlock()
		sb, _ := f.sandbox("box")
		writeJSON(w, http.StatusCreated, sb)
	})
	mux.HandleFunc("PATCH "+p+"/{name}", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.UpdateSandboxRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.updates = append(f.updates, req)
		f.mu.Unlock()
		sb, _ := f.sandbox(r.PathValue("name"))
		writeJSON(w, http.StatusOK, sb)
	})
	for _, op := range []string{"stop", "start"} {
		mux.HandleFunc("POST "+p+"/{name}/"+op, func(w http.ResponseWriter, r *http.Request) {
			f.mu.Lock()
			f.calls = append(f.calls, op+" "+r.PathValue("name"))
			f.status[r.PathValue("name")] = map[string]string{"stop": protocol.StatusStopped, "start": protocol.StatusReady}[op]
			f.mu.Unlock()
			writeJSON(w, http.StatusOK, struct{}{})
		})
	}
	mux.HandleFunc("GET "+p+"/{name}/status", func(w http.ResponseWriter, r *http.Request) {
		sb, _ := f.sandbox(r.PathValue("name"))
		writeJSON(w, http.StatusOK, protocol.StatusResponse{Status: sb.Status})
	})
	mux.HandleFunc("POST /dp/{name}/glob", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.GlobRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		defer f.mu.Unlock()
		ms, ok := f.globs[req.Path]
		if !ok {
			writeJSON(w, http.StatusNotFound, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "FileNotFound", Message: req.Path}})
			return
		}
		var out []protocol.GlobMatch
		for _, m := range ms {
			if req.Pattern == "*" || req.Pattern == "**" || strings.HasSuffix(m.Path, "/"+req.Pattern) {
				out = append(out, m)
			}
		}
		writeJSON(w, http.StatusOK, protocol.GlobResult{Matches: out})
	})
	mux.HandleFunc("GET /dp/{name}/execute/ws", f.exec)
	mux.HandleFunc("POST /dp/{name}/upload", func(w http.ResponseWriter, r *http.Request) {
		file, _, err := r.FormFile("file")
		if err != nil {
			t.Errorf("upload: %v", err)
			return
		}
		b, _ := io.ReadAll(file)
		f.mu.Lock()
		f.files[r.URL.Query().Get("path")] = string(b)
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, struct{}{})
	})
	mux.HandleFunc("GET /dp/{name}/download", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		b, ok := f.files[r.URL.Query().Get("path")]
		f.mu.Unlock()
		if !ok {
			writeJSON(w, http.StatusNotFound, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "FileNotFound", Message: "no such file"}})
			return
		}
		_, _ = io.WriteString(w, b)
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := r.Header.Get("X-Api-Key"); k != keyA && k != keyB {
			writeJSON(w, http.StatusUnauthorized, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: "Unauthorized", Message: "bad key"}})
			return
		}
		if d := r.Header.Get(protocol.DoorHeader); d != protocol.DoorE2B {
			t.Errorf("%s %s: %s = %q, want %q", r.Method, r.URL.Path, protocol.DoorHeader, d, protocol.DoorE2B)
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeCubicle) sandbox(name string) (protocol.Sandbox, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.status[name]
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return protocol.Sandbox{ID: "id-" + name, Name: name, Status: st, DataplaneURL: f.srv.URL + "/dp/" + name, SnapshotID: "snap-1",
		VCPUs: 2, MemBytes: 512 << 20, FSCapacityBytes: 1 << 30, IdleTTLSeconds: 300, CreatedAt: now, UpdatedAt: now,
		Labels: map[string]string{"suite": "unit", onTimeoutLabel: onPause}, RunConfig: &protocol.RunConfig{User: "root"}}, ok
}

func (f *fakeCubicle) setGlob(dir string, ms ...protocol.GlobMatch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.globs[dir] = ms
}

// exec runs the fake's commands: "cat" echoes input until close_stdin,
// "sleep" waits for a kill (exit 137), anything else prints "ran:<command>"
// and "<shell>" on stderr and exits 3.
func (f *fakeCubicle) exec(w http.ResponseWriter, r *http.Request) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	read := func() protocol.ExecFrame {
		var fr protocol.ExecFrame
		_, b, err := conn.Read(ctx)
		if err == nil {
			_ = json.Unmarshal(b, &fr)
		}
		return fr
	}
	send := func(fr protocol.ExecFrame) {
		b, _ := json.Marshal(fr)
		_ = conn.Write(ctx, websocket.MessageText, b)
	}
	code := func(c int) protocol.ExecFrame { return protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &c} }
	var off int64
	outFrame := func(stream, s string) protocol.ExecFrame {
		o := off
		off += int64(len(s))
		return protocol.ExecFrame{Type: stream, Data: s, Offset: &o}
	}
	x := read()
	f.mu.Lock()
	if x.TimeoutSeconds != nil {
		f.timeouts = append(f.timeouts, *x.TimeoutSeconds)
	} else {
		f.timeouts = append(f.timeouts, -1)
	}
	f.mu.Unlock()
	send(protocol.ExecFrame{Type: protocol.FrameStarted, CommandID: x.CommandID, PID: 77})
	switch x.Command {
	case "cat", "sleep 60":
		for {
			fr := read()
			switch fr.Type {
			case protocol.FrameInput:
				send(outFrame(protocol.FrameStdout, fr.Data))
			case protocol.FrameCloseStdin:
				send(code(0))
				return
			case protocol.FrameKill:
				send(code(137))
				return
			case "":
				return
			}
		}
	default:
		send(outFrame(protocol.FrameStdout, "ran:"+x.Command))
		send(protocol.ExecFrame{Type: protocol.FrameStderr, Data: x.Shell, Offset: new(int64)})
		send(code(3))
	}
}

// door returns a Door over f and an httptest server serving it.
func (f *fakeCubicle) door() (*Door, *httptest.Server) {
	d := New(Config{Endpoint: f.srv.URL, TTLGranularity: time.Minute})
	d.pollEvery = 10 * time.Millisecond
	srv := httptest.NewServer(d)
	f.t.Cleanup(srv.Close)
	return d, srv
}

package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

const testKey = "test-key"

// fakeAPI is a TEST DOUBLE of the daemon's API: sandboxes in a map, files
// in memory, and an exec WebSocket that understands a few commands:
// "echo TEXT", "yes N" (N bytes of y\n), "cat" (stdin to stdout until
// close_stdin), "sleep" (until killed), "slow" (a timeout) and "exit N".
// Every request must carry the test key and the MCP door, or the test
// fails. The real API is exercised end to end under test/e2e.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	sandboxes map[string]protocol.Sandbox
	files     map[string][]byte // "sandbox:/path"
	commands  []string
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, sandboxes: map[string]protocol.Sandbox{}, files: map[string][]byte{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/sandboxes/boxes", f.create)
	mux.HandleFunc("GET /v2/sandboxes/boxes", f.list)
	mux.HandleFunc("GET /v2/sandboxes/boxes/{name}", f.get)
	mux.HandleFunc("DELETE /v2/sandboxes/boxes/{name}", f.delete)
	mux.HandleFunc("POST /v2/sandboxes/boxes/{name}/fork", f.fork)
	mux.HandleFunc("GET /v2/sandboxes/diff", f.diff)
	mux.HandleFunc("POST /v2/sandboxes/boxes/{name}/snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.CaptureSnapshotRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, http.StatusCreated, protocol.Snapshot{ID: "snap-" + req.Name, Name: req.Name, Status: protocol.SnapshotReady})
	})
	mux.HandleFunc("POST /v2/sandboxes/boxes/{name}/reset", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.ResetRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		sb := f.sandbox(r.PathValue("name"))
		sb.SnapshotID = req.SnapshotID
		writeJSON(w, http.StatusOK, sb)
	})
	mux.HandleFunc("POST /v2/sandboxes/boxes/{name}/stop", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, f.sandbox(r.PathValue("name")))
	})
	mux.HandleFunc("POST /v2/sandboxes/boxes/{name}/service-url", func(w http.ResponseWriter, r *http.Request) {
		var req protocol.ServiceURLRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		writeJSON(w, http.StatusOK, protocol.ServiceURLResponse{ServiceURL: fmt.Sprintf("https://%s--%d.svc", r.PathValue("name"), req.Port), Token: "tok"})
	})
	mux.HandleFunc("GET /v2/sandboxes/boxes/{name}/audit", f.audit)
	mux.HandleFunc("GET /dp/{name}/execute/ws", f.exec)
	mux.HandleFunc("POST /dp/{name}/upload", f.upload)
	mux.HandleFunc("GET /dp/{name}/download", f.download)
	mux.HandleFunc("POST /dp/{name}/glob", f.glob)
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Api-Key") != testKey {
			writeJSON(w, http.StatusUnauthorized, detail("Unauthorized", "bad key"))
			return
		}
		if d := r.Header.Get(protocol.DoorHeader); d != protocol.DoorMCP {
			t.Errorf("%s %s came through door %q, want mcp", r.Method, r.URL.Path, d)
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func detail(typ, msg string) protocol.ErrorBody {
	return protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: typ, Message: msg}}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// client is an SDK client of the double, as the MCP door builds one.
func (f *fakeAPI) client() *cubicle.Client {
	return cubicle.New(f.srv.URL, testKey, cubicle.WithDoor(protocol.DoorMCP))
}

// session connects an MCP client to a server acting on the double.
func (f *fakeAPI) session(t *testing.T) *mcp.ClientSession {
	t.Helper()
	srv, closeFn := NewServer(f.client(), nil)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Close(); closeFn() })
	return cs
}

func (f *fakeAPI) sandbox(name string) protocol.Sandbox {
	return protocol.Sandbox{ID: "id-" + name, Name: name, Status: protocol.StatusReady, DataplaneURL: f.srv.URL + "/dp/" + name,
		SnapshotID: "snap", CPUMillicores: 1000, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (f *fakeAPI) create(w http.ResponseWriter, r *http.Request) {
	var req protocol.CreateSandboxRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, detail("ValidationError", err.Error()))
		return
	}
	sb := f.sandbox(req.Name)
	if req.MemBytes != nil {
		sb.MemBytes = *req.MemBytes
	}
	if len(req.ProxyConfig) > 0 {
		sb.Labels = map[string]string{"proxy_config": string(req.ProxyConfig)}
	}
	f.mu.Lock()
	f.sandboxes[req.Name] = sb
	f.mu.Unlock()
	writeJSON(w, http.StatusCreated, sb)
}

func (f *fakeAPI) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	var names []string
	for n := range f.sandboxes {
		names = append(names, n)
	}
	f.mu.Unlock()
	sort.Strings(names)
	var l protocol.SandboxList
	for _, n := range names {
		l.Sandboxes = append(l.Sandboxes, f.sandbox(n))
	}
	writeJSON(w, http.StatusOK, l)
}

func (f *fakeAPI) get(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	sb, ok := f.sandboxes[r.PathValue("name")]
	f.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, detail("NotFound", "sandbox not found"))
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (f *fakeAPI) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	delete(f.sandboxes, r.PathValue("name"))
	f.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

func (f *fakeAPI) fork(w http.ResponseWriter, r *http.Request) {
	var req protocol.ForkRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	out := protocol.ForkResponse{SnapshotID: "fork-snap"}
	f.mu.Lock()
	for _, n := range req.Names {
		f.sandboxes[n] = f.sandbox(n)
		out.Sandboxes = append(out.Sandboxes, f.sandbox(n))
	}
	f.mu.Unlock()
	writeJSON(w, http.StatusCreated, out)
}

func (f *fakeAPI) diff(w http.ResponseWriter, r *http.Request) {
	d := protocol.DiffResponse{A: r.URL.Query().Get("a"), B: r.URL.Query().Get("b")}
	for i := range 5 {
		d.Changes = append(d.Changes, protocol.DiffEntry{Path: "/f" + string(rune('0'+i)), Kind: protocol.DiffAdded, SizeBytes: 1})
	}
	writeJSON(w, http.StatusOK, d)
}

// audit serves a record of 250 events, seq 1..250, a page at a time.
func (f *fakeAPI) audit(w http.ResponseWriter, r *http.Request) {
	var since, limit int64 = 0, 100
	if v := r.URL.Query().Get("since_seq"); v != "" {
		_ = json.Unmarshal([]byte(v), &since)
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		_ = json.Unmarshal([]byte(v), &limit)
	}
	l := protocol.AuditList{NextSeq: since}
	for seq := since + 1; seq <= 250 && seq <= since+limit; seq++ {
		l.Items = append(l.Items, protocol.AuditEvent{Seq: seq, Kind: protocol.KindCommand, Type: protocol.EventCommandStarted,
			Actor: protocol.Actor{User: "u"}, Data: json.RawMessage(`{"command":"true","door":"mcp"}`)})
		l.NextSeq = seq
	}
	writeJSON(w, http.StatusOK, l)
}

func (f *fakeAPI) upload(w http.ResponseWriter, r *http.Request) {
	file, _, err := r.FormFile("file")
	if err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, detail("ValidationError", err.Error()))
		return
	}
	b, _ := io.ReadAll(file)
	f.mu.Lock()
	f.files[r.PathValue("name")+":"+r.URL.Query().Get("path")] = b
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{})
}

func (f *fakeAPI) download(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	b, ok := f.files[r.PathValue("name")+":"+r.URL.Query().Get("path")]
	f.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, detail("FileNotFound", "no such file"))
		return
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
}

func (f *fakeAPI) glob(w http.ResponseWriter, r *http.Request) {
	var req protocol.GlobRequest
	_ = json.NewDecoder(r.Body).Decode(&req)
	var res protocol.GlobResult
	f.mu.Lock()
	for k, b := range f.files {
		name, p, _ := strings.Cut(k, ":")
		if ok, _ := path.Match(req.Pattern, path.Base(p)); ok && name == r.PathValue("name") {
			res.Matches = append(res.Matches, protocol.GlobMatch{Path: p, SizeBytes: int64(len(b))})
		}
	}
	f.mu.Unlock()
	writeJSON(w, http.StatusOK, res)
}

// exec runs one fake command per connection.
func (f *fakeAPI) exec(w http.ResponseWriter, r *http.Request) {
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	ctx := r.Context()
	var first protocol.ExecFrame
	if wsjson.Read(ctx, conn, &first) != nil {
		return
	}
	f.mu.Lock()
	f.commands = append(f.commands, first.Command)
	f.mu.Unlock()
	_ = wsjson.Write(ctx, conn, protocol.ExecFrame{Type: protocol.FrameStarted, CommandID: first.CommandID})
	var off int64
	emit := func(s string) {
		o := off
		off += int64(len(s))
		_ = wsjson.Write(ctx, conn, protocol.ExecFrame{Type: protocol.FrameStdout, Data: s, Offset: &o})
	}
	exit := func(code int) {
		_ = wsjson.Write(ctx, conn, protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &code})
	}
	verb, arg, _ := strings.Cut(first.Command, " ")
	switch verb {
	case "echo":
		emit(arg + "\n")
		exit(0)
	case "yes":
		var n int
		_ = json.Unmarshal([]byte(arg), &n)
		for n > 0 {
			chunk := min(n, 10000)
			emit(strings.Repeat("y\n", chunk/2))
			n -= chunk
		}
		exit(0)
	case "exit":
		var n int
		_ = json.Unmarshal([]byte(arg), &n)
		exit(n)
	case "slow":
		_ = wsjson.Write(ctx, conn, protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrCommandTimeout, Error: "timed out"})
	case "cat", "sleep":
		for {
			var in protocol.ExecFrame
			if wsjson.Read(ctx, conn, &in) != nil {
				return
			}
			switch in.Type {
			case protocol.FrameInput:
				emit(in.Data)
			case protocol.FrameCloseStdin:
				exit(0)
				return
			case protocol.FrameKill:
				exit(137) // the killed command's exit may beat the close
				return
			}
		}
	}
}

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/telemetry"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// dataplane resolves the sandbox a dataplane request names for op (waking
// it if stopped) or writes the error and reports false. The caller
// releases the returned handle.
func (s *Server) dataplane(w http.ResponseWriter, r *http.Request, op authz.Op) (*sandbox.Conn, bool) {
	telemetry.SetSandbox(r.Context(), r.PathValue("id"))
	dp, err := s.mgr.Dataplane(sandbox.WithRequestKind(r.Context(), requestKind(r.URL.Path)), r.PathValue("id"), op)
	if err != nil {
		writeError(r.Context(), w, err)
		return nil, false
	}
	return dp, true
}

// wsReadLimit bounds one exec frame from the client (input chunks); frames
// from the agent are bounded by agent.MaxAgentFrame (DialExec).
const wsReadLimit = 32 << 20

// layerExec merges the sandbox's effective run config with a command's own
// (spec §4.3) and folds the deprecated env/cwd into it. Combining run_config
// with env or cwd is refused, as the client does.
func layerExec(base protocol.RunConfig, f *protocol.ExecFrame) error {
	if f.RunConfig != nil && (len(f.Env) > 0 || f.Cwd != "") {
		return errdefs.Field("run_config", "cannot be combined with the deprecated env or cwd")
	}
	over := f.RunConfig
	if over == nil && (len(f.Env) > 0 || f.Cwd != "") {
		over = &protocol.RunConfig{WorkDir: f.Cwd, EnvVars: f.Env}
	}
	if over != nil && over.WorkDir != "" && !strings.HasPrefix(over.WorkDir, "/") {
		return errdefs.Field("run_config.work_dir", "must be an absolute path")
	}
	rc := base.Layer(over)
	f.RunConfig, f.Env, f.Cwd = &rc, nil, ""
	return nil
}

// execute runs one command to completion (spec D1). HTTP exec has no stdin.
func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req protocol.ExecuteRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if req.Command == "" {
		writeValidation(w, "command", "is required")
		return
	}
	conn, ok := s.dataplane(w, r, authz.Exec)
	if !ok {
		return
	}
	defer conn.Release()
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = 60
	}
	f := protocol.ExecFrame{Type: protocol.FrameExecute, Command: req.Command, Shell: req.Shell, TimeoutSeconds: &timeout,
		Env: req.Env, Cwd: req.Cwd, RunConfig: req.RunConfig, CloseStdin: true, CommandID: uuid.NewString()}
	if err := layerExec(conn.RunConfig, &f); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	ctx, cancel := cancelOn(r.Context(), conn.Gone)
	defer cancel()
	stdout, stderr := &cappedOutput{max: s.execOutputLimit}, &cappedOutput{max: s.execOutputLimit}
	outw, errw, recorded := s.recordExecute(r, conn, &f, req, stdout, stderr)
	ctx, done := s.tel.Exec(ctx, "http", r.PathValue("id"), f.CommandID)
	code, err := conn.Agent.Exec(ctx, f, outw, errw)
	done(code, err)
	recorded(ctx, code, err)
	switch {
	case errors.Is(err, agent.ErrCommandTimeout):
		writeDetail(w, http.StatusRequestTimeout, protocol.ErrCommandTimeout, fmt.Sprintf("command timed out after %ds", timeout))
	case err != nil && conn.Revoked():
		// The cancelled Exec has killed the command.
		writeDetail(w, http.StatusForbidden, "Forbidden", revokedMessage)
	case err != nil && closedWithin(conn.Gone, goneWait):
		writeDetail(w, http.StatusBadGateway, "ConnectionError", "the sandbox stopped while the command ran: "+s.mgr.StatusMessage(r.Context(), r.PathValue("id")))
	case err != nil:
		writeDetail(w, http.StatusBadGateway, "ConnectionError", err.Error())
	default:
		writeExecuteResult(w, protocol.ExecuteResult{Stdout: stdout.String(), Stderr: stderr.String(), ExitCode: code,
			StdoutTruncated: stdout.truncated(), StderrTruncated: stderr.truncated(), StdoutBytes: stdout.total, StderrBytes: stderr.total})
	}
}

// DefaultExecOutputLimit is how many bytes of each stream POST /execute
// keeps by default (WithExecOutputLimit).
const DefaultExecOutputLimit = 16 << 20

// cappedOutput keeps the first max bytes written to it and counts the
// rest, so a command's output never decides the daemon's memory.
type cappedOutput struct {
	b     strings.Builder
	max   int
	total int64
}

// Write keeps what fits and drops the rest, never failing: the command
// runs on to its exit code.
func (c *cappedOutput) Write(p []byte) (int, error) {
	c.total += int64(len(p))
	if room := c.max - c.b.Len(); room > 0 {
		c.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (c *cappedOutput) truncated() bool { return c.total > int64(c.b.Len()) }

// String is what was kept, without a rune cut in half at the cap.
func (c *cappedOutput) String() string {
	s := c.b.String()
	if c.truncated() {
		for i := 0; i < utf8.UTFMax && len(s) > 0; i++ {
			if r, n := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || n != 1 {
				break
			}
			s = s[:len(s)-1]
		}
	}
	return s
}

// writeExecuteResult writes res as JSON, escaping stdout and stderr piece
// by piece, so their escaped form (up to 6× the bytes for control
// characters) is never held whole.
func writeExecuteResult(w http.ResponseWriter, res protocol.ExecuteResult) {
	stdout, stderr := res.Stdout, res.Stderr
	res.Stdout, res.Stderr = "", ""
	rest, err := json.Marshal(res)
	const head = `{"stdout":"","stderr":""`
	if err != nil || !bytes.HasPrefix(rest, []byte(head)) {
		res.Stdout, res.Stderr = stdout, stderr
		writeJSON(w, http.StatusOK, res)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, `{"stdout":`)
	writeJSONString(w, stdout)
	io.WriteString(w, `,"stderr":`)
	writeJSONString(w, stderr)
	w.Write(rest[len(head):])
	io.WriteString(w, "\n")
}

// writeJSONString writes s as a JSON string, encoding 64 KiB at a time cut
// at rune boundaries (so the result equals json.Marshal(s)).
func writeJSONString(w io.Writer, s string) {
	io.WriteString(w, `"`)
	for len(s) > 0 {
		n := min(len(s), 64<<10)
		for i := 0; i < utf8.UTFMax-1 && n < len(s) && !utf8.RuneStart(s[n]); i++ {
			n--
		}
		b, _ := json.Marshal(s[:n])
		w.Write(b[1 : len(b)-1])
		s = s[n:]
	}
	io.WriteString(w, `"`)
}

// executeWS relays the WebSocket exec protocol (spec §6) between the client
// and the sandbox's agent, which owns command sessions. The daemon only
// rewrites the first execute frame to apply the layered run config.
func (s *Server) executeWS(w http.ResponseWriter, r *http.Request) {
	dp, ok := s.dataplane(w, r, authz.Exec)
	if !ok {
		return
	}
	defer dp.Release()
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer conn.CloseNow()
	conn.SetReadLimit(wsReadLimit)
	ctx := r.Context()

	var first protocol.ExecFrame
	if err := wsjson.Read(ctx, conn, &first); err != nil {
		return
	}
	if first.Type == protocol.FrameExecute {
		var done func(int, error)
		ctx, done = s.tel.Exec(ctx, "ws", r.PathValue("id"), first.CommandID)
		defer done(-1, nil)
		if err := layerExec(dp.RunConfig, &first); err != nil {
			_ = wsjson.Write(ctx, conn, protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrCommandError, Error: err.Error()})
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		if first.CommandID == "" {
			first.CommandID = uuid.NewString() // named, so its record's step can be found on reconnect
		}
	}
	// The file record's baseline (beforeCommand) is taken while the agent
	// connection is being made: both are done before the command is sent.
	id := r.PathValue("id")
	indexed := make(chan struct{})
	go func() { defer close(indexed); s.beforeCommand(ctx, id, &first) }()
	up, err := dp.Agent.DialExec(ctx)
	<-indexed
	if err != nil {
		// 1011 before `started` is fatal for the client: say why.
		s.log.Warn("exec: agent unreachable", "sandbox", id, "err", err)
		conn.Close(websocket.StatusInternalError, "sandbox agent unreachable")
		return
	}
	defer up.CloseNow()
	if err := wsjson.Write(ctx, up, first); err != nil {
		s.log.Warn("exec: agent unreachable", "sandbox", id, "err", err)
		conn.Close(websocket.StatusInternalError, "sandbox agent unreachable")
		return
	}
	tap := s.tapExec(ctx, id, dp, &first, "ws")
	relay(ctx, conn, up, dp.Gone, dp.Touch, func() (string, bool) {
		if dp.Revoked() {
			return revokedMessage, true
		}
		return stoppedMessage(s.mgr.StatusMessage(context.WithoutCancel(ctx), id)), false
	}, tap)
}

// revokedMessage ends an exec whose caller lost access to the sandbox
// (sandbox.Manager.Reauthorize) while it ran; its command is killed.
const revokedMessage = "access to the sandbox was revoked while the command ran; the command was killed"

// goneWait bounds how long a relay whose agent connection broke waits for
// the manager to notice that the sandbox died (its watcher fires within
// milliseconds of the exit).
const goneWait = 2 * time.Second

// relay copies frames both ways until one side closes, then closes the other
// with the same status, so the client sees the agent's normal closure after
// exit and the agent sees a client's disconnect. If the sandbox instance
// goes (stopped, or died e.g. out of memory), its commands are gone with
// it: the client gets a terminal error frame saying why (why() says, from
// the sandbox's status message), so it neither hangs nor reconnects, which
// would wake a sandbox the user just stopped, or reach the next instance
// and hear CommandNotFound instead of the reason. When gone closes because
// the caller's access was cut (why reports kill), the command is killed
// first: the agent would otherwise keep it for a reconnect. Every frame,
// either way, calls touch (activity for the idle TTL).
//
// Neither pipe's context is cancelled before the client has been told:
// the websocket library closes a connection whose read or write context
// ends. tap (may be nil) sees every frame, for the command's record.
func relay(ctx context.Context, client, up *websocket.Conn, gone <-chan struct{}, touch func(), why func() (msg string, kill bool), tap *execTap) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	upErr, clientErr := make(chan error, 1), make(chan error, 1)
	// held stops the agent's frames reaching the client once the relay
	// has decided to end it: the exit frame the agent sends for a killed
	// command must not beat the error frame saying why.
	var held atomic.Bool
	go func() { clientErr <- pipe(ctx, up, client, touch, tap.fromClient, nil) }()  // client → agent
	go func() { upErr <- pipe(ctx, client, up, touch, tap.fromAgent, held.Load) }() // agent → client
	select {
	case err := <-clientErr:
		up.Close(closeStatus(err), "")
		return
	case err := <-upErr:
		// A close frame is the agent's answer; a broken connection may be
		// the sandbox dying, which gone confirms.
		if websocket.CloseStatus(err) != -1 || !closedWithin(gone, goneWait) {
			client.Close(closeStatus(err), "")
			return
		}
	case <-gone:
		held.Store(true)
		msg, kill := why()
		if kill {
			killCommand(ctx, up)
		}
		up.CloseNow()
		endClient(ctx, client, msg)
		return
	}
	msg, _ := why()
	endClient(ctx, client, msg)
}

// killCommand asks the agent to kill the command of exec connection up
// (its process group), waiting at most a second to say so.
func killCommand(ctx context.Context, up *websocket.Conn) {
	kctx, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	_ = wsjson.Write(kctx, up, protocol.ExecFrame{Type: protocol.FrameKill})
}

// endClient sends the client a terminal error frame saying msg and closes.
func endClient(ctx context.Context, client *websocket.Conn, msg string) {
	_ = wsjson.Write(ctx, client, protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrCommandError, Error: msg})
	client.Close(websocket.StatusNormalClosure, "sandbox stopped")
}

// stoppedMessage tells a client its command's sandbox stopped, and why
// (the sandbox's status message) when known.
func stoppedMessage(reason string) string {
	msg := "the sandbox stopped while the command ran"
	if reason != "" {
		msg += ": " + reason
	}
	return msg
}

// closedWithin reports whether ch is closed within d.
func closedWithin(ch <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// pipe copies frames from src to dst, showing each to see first. Once
// held (may be nil) reports true, frames are read and dropped.
func pipe(ctx context.Context, dst, src *websocket.Conn, touch func(), see func([]byte), held func() bool) error {
	for {
		typ, data, err := src.Read(ctx)
		if err != nil {
			return err
		}
		if held != nil && held() {
			continue
		}
		touch()
		see(data)
		if err := dst.Write(ctx, typ, data); err != nil {
			return err
		}
	}
}

func closeStatus(err error) websocket.StatusCode {
	if st := websocket.CloseStatus(err); st != -1 {
		return st
	}
	return websocket.StatusGoingAway
}

// filePath returns the ?path= parameter, required. The agent resolves it
// inside the sandbox's own root, so ".." cannot leave it; a relative path
// is resolved by inWorkDir.
func filePath(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", errdefs.Field("path", "is required")
	}
	if strings.ContainsRune(p, 0) {
		return "", errdefs.Field("path", "must not contain NUL")
	}
	return p, nil
}

// inWorkDir resolves a relative file path (`write("data.txt")`) where a
// command without its own cwd starts: the sandbox's run_config.work_dir
// (absolute) when set. Otherwise the path stays relative and the agent
// resolves it against the run_config user's home, else "/", as it does a
// command's start directory.
func inWorkDir(rc protocol.RunConfig, p string) string {
	if rc.WorkDir == "" || strings.HasPrefix(p, "/") {
		return p
	}
	return path.Join(rc.WorkDir, p)
}

// upload streams the multipart part "file" into the sandbox (spec D3),
// creating parent directories. The body is never held whole in memory.
func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	p, err := filePath(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	dp, ok := s.dataplane(w, r, authz.UploadFile)
	if !ok {
		return
	}
	defer dp.Release()
	p = inWorkDir(dp.RunConfig, p)
	var body io.Reader = r.Body
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); strings.HasPrefix(mt, "multipart/") {
		mr, err := r.MultipartReader()
		if err != nil {
			writeValidation(w, "file", err.Error())
			return
		}
		for {
			part, err := mr.NextPart()
			if err != nil {
				writeValidation(w, "file", "multipart body has no part named \"file\"")
				return
			}
			if part.FormName() == "file" {
				body = part
				break
			}
		}
	}
	cr := &countingReader{r: body}
	if err := dp.Agent.WriteFile(r.Context(), dp.RunConfig.User, p, 0o644, cr); err != nil {
		writeAgentError(w, r, err)
		return
	}
	s.recordFile(r.Context(), r.PathValue("id"), dp.WorkspaceID, protocol.EventFileUploaded, fileData{Path: p, Bytes: cr.n})
	writeJSON(w, http.StatusOK, map[string]string{"path": p})
}

// relayedFileHeaders are the response headers passed from the agent to the
// client for downloads.
var relayedFileHeaders = []string{"Content-Type", "Content-Length", "Content-Range", "Accept-Ranges", "ETag", "Last-Modified"}

// download streams a file out of the sandbox (spec D4–D6). The agent serves
// conditional and range requests; the daemon relays headers and bytes.
func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	p, err := filePath(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	dp, ok := s.dataplane(w, r, authz.DownloadFile)
	if !ok {
		return
	}
	defer dp.Release()
	s.relayRecorded(w, r, r.PathValue("id"), dp, inWorkDir(dp.RunConfig, p), "api", nil)
}

// relayFile streams path out of the sandbox behind dp. The agent serves
// conditional and range requests; the daemon relays headers and bytes.
// extra (may be nil) sets response headers over the agent's on a 2xx or
// 304 answer; download links use it to pin content type and disposition.
func relayFile(w http.ResponseWriter, r *http.Request, dp *sandbox.Conn, path string, extra http.Header) {
	hdr := http.Header{}
	for _, k := range []string{"Range", "If-Range", "If-None-Match", "If-Modified-Since", "If-Match", "If-Unmodified-Since"} {
		if v := r.Header.Values(k); len(v) > 0 {
			hdr[k] = v
		}
	}
	open := dp.Agent.OpenFile
	if r.Method == http.MethodHead {
		open = dp.Agent.HeadFile
	}
	resp, err := open(r.Context(), dp.RunConfig.User, path, hdr)
	if err != nil {
		writeAgentError(w, r, err)
		return
	}
	defer resp.Body.Close()
	for _, k := range relayedFileHeaders {
		if v := resp.Header.Values(k); len(v) > 0 {
			w.Header()[k] = v
		}
	}
	if resp.StatusCode < 300 || resp.StatusCode == http.StatusNotModified {
		for k, v := range extra {
			w.Header()[k] = v
		}
	}
	w.WriteHeader(relayedStatus(resp.StatusCode))
	if r.Method != http.MethodHead {
		_, _ = io.Copy(w, resp.Body)
	}
}

// relayedStatus is the status the daemon answers for an agent's: what the
// request or the sandbox's files caused (2xx–4xx) passes; an agent fault
// (5xx) or anything odd is a 502, the sandbox side having failed.
func relayedStatus(code int) int {
	if code >= 200 && code < 500 {
		return code
	}
	return http.StatusBadGateway
}

// writeAgentError reports a failure to reach or use the agent.
func writeAgentError(w http.ResponseWriter, r *http.Request, err error) {
	var he *agent.HTTPError
	if errors.As(err, &he) {
		writeDetail(w, relayedStatus(he.Status), he.Kind, he.Message)
		return
	}
	if errors.Is(err, context.DeadlineExceeded) {
		writeDetail(w, http.StatusGatewayTimeout, "Timeout", err.Error())
		return
	}
	writeDetail(w, http.StatusBadGateway, "ConnectionError", err.Error())
}

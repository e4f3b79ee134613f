package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// The daemon records every command from its own side of the dataplane:
// what it sent the agent (command, shell, user, cwd, env names, timeout)
// and what came back through it (output, exit). The in-sandbox agent is
// untrusted, so nothing it could forge is the only source: timing is the
// daemon's clock, the command string the daemon's frame.

// requestKind names a dataplane request for the record (what woke a
// sandbox): execute, exec_ws, upload, download.
func requestKind(p string) string {
	if k := path.Base(p); k != "ws" {
		return k
	}
	return "exec_ws"
}

// commandStart is the record's view of execute frame f (already layered
// over the sandbox's run config); ownEnv is the env the caller sent, ctx
// the request's (for its door).
func commandStart(ctx context.Context, sandboxID string, dp *sandbox.Conn, f *protocol.ExecFrame, ownEnv []string, via string) record.CommandStart {
	cs := record.CommandStart{SandboxID: sandboxID, WorkspaceID: dp.WorkspaceID, CommandID: f.CommandID, Command: f.Command,
		Shell: f.Shell, EnvKeys: ownEnv, PTY: f.PTY, Via: via, Door: doorOf(ctx)}
	if f.RunConfig != nil {
		cs.User, cs.Cwd = f.RunConfig.User, f.RunConfig.WorkDir
	}
	if f.TimeoutSeconds != nil {
		cs.TimeoutSeconds = *f.TimeoutSeconds
	}
	return cs
}

// ownEnvKeys is the names of the env an execute frame carries itself,
// before layering (the sandbox's own env is in its created/policy record).
func ownEnvKeys(f *protocol.ExecFrame) []string {
	if f.RunConfig != nil {
		return record.EnvKeys(f.RunConfig.EnvVars)
	}
	return record.EnvKeys(f.Env)
}

// execTap watches the frames of one relayed exec stream for its command's
// record. A nil *execTap watches nothing. binary follows the agent's
// started frame: output data is base64 on a connection it made binary-safe
// (protocol.EncodingBase64), text otherwise.
type execTap struct {
	ctx    context.Context // detached: the record outlives the stream
	cmd    *record.Command
	binary bool
}

// tapExec opens (execute) or resumes (reconnect, or an execute naming an
// open command) the record of the command first starts, or returns nil
// without a recorder or for a command the record does not know (one
// started before a daemon restart).
// via names the transport ("ws", "sse").
func (s *Server) tapExec(ctx context.Context, sandboxID string, dp *sandbox.Conn, first *protocol.ExecFrame, via string) *execTap {
	if s.rec == nil {
		return nil
	}
	ctx = context.WithoutCancel(ctx)
	if first.CommandID != "" {
		if cmd := s.rec.OpenCommand(sandboxID, first.CommandID); cmd != nil {
			cmd.Reconnected(ctx)
			return &execTap{ctx: ctx, cmd: cmd}
		}
	}
	if first.Type != protocol.FrameExecute {
		return nil
	}
	return &execTap{ctx: ctx, cmd: s.rec.StartCommand(ctx, commandStart(ctx, sandboxID, dp, first, ownEnvKeys(first), via))}
}

// beforeCommand runs before execute frame f is sent to sandboxID's agent
// (a reconnect starts nothing): the record's file scans of earlier
// commands finish first, so this one's writes count as its own.
func (s *Server) beforeCommand(ctx context.Context, sandboxID string, f *protocol.ExecFrame) {
	if s.rec != nil && f.Type == protocol.FrameExecute {
		s.rec.BeforeCommand(ctx, sandboxID)
	}
}

// tapFrame is the part of an exec frame the record reads.
type tapFrame struct {
	Type      string `json:"type"`
	Data      string `json:"data"`
	Offset    *int64 `json:"offset"`
	ExitCode  *int   `json:"exit_code"`
	ErrorType string `json:"error_type"`
	Encoding  string `json:"encoding"`
}

// fromAgent sees one frame on its way from the agent to the client.
// Output frames are not decoded here (see outputFrame).
func (t *execTap) fromAgent(b []byte) {
	if t == nil {
		return
	}
	if stream, lit, off, ok := outputFrame(b); ok {
		t.cmd.OutputLiteral(stream, off, lit, t.binary)
		return
	}
	var f tapFrame
	if json.Unmarshal(b, &f) != nil {
		return
	}
	switch f.Type {
	case protocol.FrameStarted:
		t.binary = f.Encoding == protocol.EncodingBase64
	case protocol.FrameStdout, protocol.FrameStderr:
		off := int64(-1)
		if f.Offset != nil {
			off = *f.Offset
		}
		data, err := protocol.FrameData(protocol.ExecFrame{Type: f.Type, Data: f.Data}, t.binary)
		if err != nil {
			return // the client is told the same: nothing to record
		}
		t.cmd.Output(f.Type, off, data)
	case protocol.FrameExit:
		t.cmd.Exited(t.ctx, f.ExitCode, "")
	case protocol.FrameError:
		if f.ErrorType == protocol.ErrCommandTimeout {
			t.cmd.Killed(t.ctx, record.KillTimeout)
		}
		if f.ErrorType == protocol.ErrCommandNotFound || f.ErrorType == protocol.ErrSessionExpired {
			t.cmd.Lost(t.ctx, f.ErrorType) // a reconnect found it gone: its exit is not known
		} else {
			t.cmd.Exited(t.ctx, nil, f.ErrorType)
		}
	}
}

// Output frames as the agent encodes them (json.Marshal of an ExecFrame:
// type, data, offset, nothing else set).
var (
	stdoutFramePrefix = []byte(`{"type":"` + protocol.FrameStdout + `","data":`)
	stderrFramePrefix = []byte(`{"type":"` + protocol.FrameStderr + `","data":`)
	offsetKey         = []byte(`,"offset":`)
)

// outputFrame splits an output frame of the agent's shape into its stream,
// data literal (still JSON-encoded) and offset, without decoding the data;
// ok is false for anything else, which the caller decodes in full. The
// key `"offset":` cannot occur inside the literal, whose quotes are
// escaped.
func outputFrame(b []byte) (stream string, lit []byte, off int64, ok bool) {
	var rest []byte
	switch {
	case bytes.HasPrefix(b, stdoutFramePrefix):
		stream, rest = protocol.FrameStdout, b[len(stdoutFramePrefix):]
	case bytes.HasPrefix(b, stderrFramePrefix):
		stream, rest = protocol.FrameStderr, b[len(stderrFramePrefix):]
	default:
		return "", nil, 0, false
	}
	i := bytes.LastIndex(rest, offsetKey)
	if i < 2 || rest[0] != '"' || rest[i-1] != '"' || rest[len(rest)-1] != '}' {
		return "", nil, 0, false
	}
	off, err := strconv.ParseInt(string(rest[i+len(offsetKey):len(rest)-1]), 10, 64)
	if err != nil || off < 0 {
		return "", nil, 0, false
	}
	return stream, rest[:i], off, true
}

// killFrame is how a kill frame starts on the wire (wsjson writes type
// first); frames that cannot be one are not decoded.
var killFrame = []byte(`"kill"`)

// fromClient sees one frame on its way from the client to the agent.
func (t *execTap) fromClient(b []byte) {
	if t == nil || len(b) > 256 || !bytes.Contains(b, killFrame) {
		return
	}
	var f tapFrame
	if json.Unmarshal(b, &f) == nil && f.Type == protocol.FrameKill {
		t.cmd.Killed(t.ctx, record.KillRequested)
	}
}

// streamWriter feeds what POST /execute relays into the command's record.
type streamWriter struct {
	cmd    *record.Command
	stream string
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.cmd.Output(w.stream, -1, p)
	return len(p), nil
}

// recordExecute opens the record of POST /execute's command f (req as
// sent): it returns the writers to give the agent client, which also feed
// the record, and the call that records how the command ended.
func (s *Server) recordExecute(r *http.Request, dp *sandbox.Conn, f *protocol.ExecFrame, req protocol.ExecuteRequest,
	stdout, stderr io.Writer) (outw, errw io.Writer, ended func(ctx context.Context, code int, err error)) {
	own := ownEnvKeys(&protocol.ExecFrame{Env: req.Env, RunConfig: req.RunConfig})
	outw, errw, _, ended = s.recordCommand(r.Context(), r.PathValue("id"), dp, f, own, "http", stdout, stderr)
	return outw, errw, ended
}

// recordCommand opens the record of command f (own env names ownEnv) run
// through dp in sandboxID by a call that returns its exit (agent.Exec):
// the writers it returns tee stdout and stderr into the record, step is
// the command's step, and ended records how the command ended. Without a
// recorder it records nothing (step 0).
func (s *Server) recordCommand(ctx context.Context, sandboxID string, dp *sandbox.Conn, f *protocol.ExecFrame, ownEnv []string, via string,
	stdout, stderr io.Writer) (outw, errw io.Writer, step int64, ended func(ctx context.Context, code int, err error)) {
	if s.rec == nil {
		return stdout, stderr, 0, func(context.Context, int, error) {}
	}
	s.rec.BeforeCommand(ctx, sandboxID)
	cmd := s.rec.StartCommand(ctx, commandStart(ctx, sandboxID, dp, f, ownEnv, via))
	return io.MultiWriter(stdout, streamWriter{cmd, record.Stdout}), io.MultiWriter(stderr, streamWriter{cmd, record.Stderr}), cmd.Step(),
		func(ctx context.Context, code int, err error) { recordExecuteEnd(ctx, cmd, code, err) }
}

// recordExecuteEnd records how a POST /execute command ended: its exit
// code, its timeout, or the error that cut it off.
func recordExecuteEnd(ctx context.Context, cmd *record.Command, code int, err error) {
	octx := context.WithoutCancel(ctx)
	var ee *agent.ExecError
	switch {
	case err == nil:
		cmd.Exited(octx, &code, "")
	case errors.Is(err, agent.ErrCommandTimeout):
		cmd.Killed(octx, record.KillTimeout)
		cmd.Exited(octx, nil, protocol.ErrCommandTimeout)
	case errors.As(err, &ee):
		cmd.Exited(octx, nil, ee.Type)
	case ctx.Err() != nil:
		cmd.Exited(octx, nil, "ClientDisconnected")
	default:
		cmd.Exited(octx, nil, "ConnectionError")
	}
}

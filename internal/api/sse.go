package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// SSE exec: the one-way transport of the newest clients. A response
// relays the agent's frames for one command as events and ends at exit, at
// an error, or once it has sent sseWindow bytes of output: then it ends with
// ack_required, and the client's resume (its offsets being the ack) picks
// up where it stopped. The command runs in the agent's session either way,
// so a dropped response loses nothing the agent's window still holds, and a
// retried start with the same command_id attaches instead of running the
// command again (the agent's sessions are get-or-create by command_id). A
// daemon shutting down ends each response with a resumable
// ServerShuttingDown error: sandboxes, and their commands, outlive it.

// sseWindow is how many output bytes one response carries before it asks
// for an ack.
const sseWindow = 8 << 20

// sseHeartbeat is the interval of comment lines that keep idle responses
// (and the client's 60 s read timeout) alive.
const sseHeartbeat = 15 * time.Second

// executeStreamStart serves POST /dp/{id}/execute/stream/start.
func (s *Server) executeStreamStart(w http.ResponseWriter, r *http.Request) {
	var req protocol.ExecStreamStartRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if req.Command == "" {
		writeError(r.Context(), w, errdefs.Field("command", "is required"))
		return
	}
	if req.CommandID == "" {
		req.CommandID = uuid.NewString()
	}
	s.execStream(w, r, func(dp *sandbox.Conn) (protocol.ExecFrame, error) {
		f := protocol.ExecFrame{Type: protocol.FrameExecute, Command: req.Command, CommandID: req.CommandID, Shell: req.Shell,
			TimeoutSeconds: req.TimeoutSeconds, IdleTimeoutSeconds: req.IdleTimeoutSeconds, TTLSeconds: req.TTLSeconds,
			Env: req.Env, Cwd: req.Cwd, RunConfig: req.RunConfig, CloseStdin: true}
		return f, layerExec(dp.RunConfig, &f)
	}, 0, 0)
}

// executeStreamResume serves POST /dp/{id}/execute/stream/resume. A
// command the agent does not know is a 404 (the client's CommandNotFound).
func (s *Server) executeStreamResume(w http.ResponseWriter, r *http.Request) {
	var req protocol.ExecStreamResumeRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if req.CommandID == "" {
		writeError(r.Context(), w, errdefs.Field("command_id", "is required"))
		return
	}
	if req.StdoutOffset < 0 || req.StderrOffset < 0 {
		writeError(r.Context(), w, errdefs.Field("stdout_offset", "offsets must not be negative"))
		return
	}
	s.execStream(w, r, func(*sandbox.Conn) (protocol.ExecFrame, error) {
		return protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: req.CommandID,
			StdoutOffset: req.StdoutOffset, StderrOffset: req.StderrOffset}, nil
	}, req.StdoutOffset, req.StderrOffset)
}

// execStream sends the agent the frame first builds and relays its answer
// as events. Until the agent's first frame arrives nothing is written, so
// a refusal is still an HTTP status.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, first func(*sandbox.Conn) (protocol.ExecFrame, error), stdoutOff, stderrOff int64) {
	ctx := r.Context()
	dp, ok := s.dataplane(w, r, authz.Exec)
	if !ok {
		return
	}
	defer dp.Release()
	f, err := first(dp)
	if err != nil {
		writeError(ctx, w, err)
		return
	}
	f.Encoding = protocol.EncodingBase64 // events carry the exact bytes
	up, err := dp.Agent.DialExec(ctx)
	if err != nil {
		writeError(ctx, w, fmt.Errorf("sandbox agent unreachable: %v: %w", err, errdefs.ErrUnavailable))
		return
	}
	defer up.CloseNow()
	up.SetReadLimit(wsReadLimit)
	s.beforeCommand(ctx, r.PathValue("id"), &f)
	if err := wsjson.Write(ctx, up, f); err != nil {
		writeError(ctx, w, fmt.Errorf("sandbox agent unreachable: %v: %w", err, errdefs.ErrUnavailable))
		return
	}
	tap := s.tapExec(ctx, r.PathValue("id"), dp, &f, "sse")
	frames := make(chan protocol.ExecFrame)
	readErr := make(chan error, 1)
	go func() {
		for {
			_, b, err := up.Read(ctx)
			var fr protocol.ExecFrame
			if err == nil {
				err = json.Unmarshal(b, &fr)
			}
			if err != nil {
				readErr <- err
				return
			}
			tap.fromAgent(b)
			select {
			case frames <- fr:
			case <-ctx.Done():
				return
			}
		}
	}()
	ev := &sseWriter{w: w, rc: http.NewResponseController(w)}
	offsets := map[string]int64{protocol.FrameStdout: stdoutOff, protocol.FrameStderr: stderrOff}
	sent, binary := 0, false
	heartbeat := time.NewTicker(sseHeartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case fr := <-frames:
			dp.Touch()
			if !ev.started {
				if fr.Type == protocol.FrameError && fr.ErrorType == protocol.ErrCommandNotFound {
					writeError(ctx, w, fmt.Errorf("command %s: %w", f.CommandID, errdefs.ErrNotFound))
					return
				}
				ev.begin()
			}
			switch fr.Type {
			case protocol.FrameStarted:
				binary = fr.Encoding == protocol.EncodingBase64
				ev.send(protocol.SSEStarted, map[string]any{"command_id": fr.CommandID, "pid": fr.PID})
			case protocol.FrameStdout, protocol.FrameStderr:
				off := offsets[fr.Type]
				if fr.Offset != nil {
					off = *fr.Offset
				}
				data, err := protocol.FrameData(fr, binary)
				if err != nil {
					ev.send(protocol.SSEError, map[string]any{"error_type": protocol.ErrCommandError, "error": "sandbox agent: " + err.Error()})
					return
				}
				ev.send(fr.Type, protocol.StreamChunk{Offset: off, Data: base64.StdEncoding.EncodeToString(data)})
				offsets[fr.Type] = off + int64(len(data))
				if sent += len(data); sent >= sseWindow {
					ev.send(protocol.SSEAckRequired, protocol.AckRequired{StdoutOffset: offsets[protocol.FrameStdout], StderrOffset: offsets[protocol.FrameStderr]})
					up.Close(websocket.StatusNormalClosure, "")
					return
				}
			case protocol.FrameExit:
				for _, st := range []string{protocol.FrameStdout, protocol.FrameStderr} {
					ev.send(protocol.SSEStreamEnd, protocol.StreamEnd{Stream: st, Offset: offsets[st]})
				}
				code := -1
				if fr.ExitCode != nil {
					code = *fr.ExitCode
				}
				ev.send(protocol.SSEExit, map[string]any{"exit_code": code})
				return
			case protocol.FrameError:
				ev.send(protocol.SSEError, map[string]any{"error_type": fr.ErrorType, "error": fr.Error})
				return
			}
		case err := <-readErr:
			if ctx.Err() != nil {
				return // the client went away
			}
			msg := fmt.Sprintf("sandbox agent connection lost: %v", err)
			if closedWithin(dp.Gone, goneWait) {
				msg = stoppedMessage(s.mgr.StatusMessage(context.WithoutCancel(ctx), r.PathValue("id")))
			}
			ev.begin()
			ev.send(protocol.SSEError, map[string]any{"error_type": protocol.ErrCommandError, "error": msg})
			return
		case <-dp.Gone:
			// The instance stopped, or the caller's access was revoked:
			// then its command is killed, as on the WebSocket.
			msg := stoppedMessage(s.mgr.StatusMessage(context.WithoutCancel(ctx), r.PathValue("id")))
			if dp.Revoked() {
				msg = revokedMessage
				killCommand(ctx, up)
			}
			ev.begin()
			ev.send(protocol.SSEError, map[string]any{"error_type": protocol.ErrCommandError, "error": msg})
			return
		case <-s.draining:
			// Resumable: the command runs on in the sandbox, and the
			// client resumes against the next daemon.
			ev.begin()
			ev.send(protocol.SSEError, map[string]any{"error_type": protocol.ErrServerShuttingDown, "error": "the Cubicle daemon is shutting down; resume the command"})
			return
		case <-heartbeat.C:
			ev.begin()
			ev.comment("heartbeat")
		case <-ctx.Done():
			return
		}
	}
}

// sseWriter writes events, flushing each.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
}

// begin writes the response header once.
func (e *sseWriter) begin() {
	if e.started {
		return
	}
	e.started = true
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	e.w.WriteHeader(http.StatusOK)
	e.rc.Flush()
}

func (e *sseWriter) send(event string, data any) {
	b, _ := json.Marshal(data)
	fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b)
	e.rc.Flush()
}

func (e *sseWriter) comment(text string) {
	fmt.Fprintf(e.w, ": %s\n\n", text)
	e.rc.Flush()
}

package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Exec protocol defaults (spec §6.2).
const (
	defaultShell       = "/bin/bash"
	fallbackShell      = "/bin/sh"
	defaultTimeout     = 60 * time.Second
	defaultIdleTimeout = 300 * time.Second
	defaultTTL         = 600 * time.Second
	defaultPath        = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	defaultRows        = 24
	defaultCols        = 80
	pingInterval       = 20 * time.Second
	firstFrameTimeout  = 30 * time.Second
	writeTimeout       = 60 * time.Second
	maxFrameData       = 32 << 10  // bytes of output per text frame
	maxBinaryFrameData = 256 << 10 // per binary frame: 4/3 of it once base64, within MaxAgentFrame
	maxClientFrame     = 16 << 20  // largest accepted client frame
)

// MaxAgentFrame is the largest exec frame the daemon accepts from an agent.
// The agent's output frames carry at most maxFrameData bytes of text (≤ 6×
// that once JSON-escaped) or maxBinaryFrameData bytes as base64, so this
// only stops a hostile agent from making the
// daemon buffer big frames.
const MaxAgentFrame = 1 << 20

// handleExec serves one exec WebSocket: the first frame starts (or attaches
// to) a session, then output streams until exit while input, close_stdin,
// kill and resize frames are applied.
func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept has already written the HTTP error
	}
	defer c.CloseNow()
	c.SetReadLimit(maxClientFrame)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	sess, offs, binary, err := s.openSession(ctx, c)
	if err != nil {
		var fe *frameError
		if !errors.As(err, &fe) {
			return
		}
		if writeFrame(ctx, c, protocol.ExecFrame{Type: protocol.FrameError, ErrorType: fe.kind, Error: fe.msg}) == nil {
			c.Close(websocket.StatusNormalClosure, "")
		}
		return
	}
	defer sess.detach()
	started := protocol.ExecFrame{Type: protocol.FrameStarted, CommandID: sess.id, PID: sess.proc.pid}
	if binary {
		started.Encoding = protocol.EncodingBase64
	}
	if err := writeFrame(ctx, c, started); err != nil {
		return
	}
	go s.readClient(ctx, cancel, c, sess, binary)
	go keepalive(ctx, cancel, c)
	if err := sess.stream(ctx, c, offs, binary); err != nil {
		return
	}
	c.Close(websocket.StatusNormalClosure, "")
}

// frameError is a failure reported to the client as an error frame.
type frameError struct{ kind, msg string }

func (e *frameError) Error() string { return e.kind + ": " + e.msg }

// openSession reads the first frame and returns the attached session, the
// stream offsets to replay from and whether the connection is binary-safe
// (the frame asked for protocol.EncodingBase64).
func (s *Server) openSession(ctx context.Context, c *websocket.Conn) (*session, [2]int64, bool, error) {
	var offs [2]int64
	rctx, cancel := context.WithTimeout(ctx, firstFrameTimeout)
	defer cancel()
	f, err := readFrame(rctx, c)
	if err != nil {
		return nil, offs, false, err
	}
	binary := f.Encoding == protocol.EncodingBase64
	if f.Encoding != "" && !binary {
		return nil, offs, false, &frameError{protocol.ErrCommandError, fmt.Sprintf("unknown encoding %q (want %q)", f.Encoding, protocol.EncodingBase64)}
	}
	var sess *session
	switch f.Type {
	case protocol.FrameExecute:
		sess, err = s.execute(f)
	case protocol.FrameReconnect:
		sess, err = s.sessions.lookup(f.CommandID)
		offs = [2]int64{f.StdoutOffset, f.StderrOffset}
	default:
		err = &frameError{protocol.ErrCommandError, fmt.Sprintf("first frame must be execute or reconnect, got %q", f.Type)}
	}
	switch {
	case errors.Is(err, errSessionNotFound):
		return nil, offs, false, &frameError{protocol.ErrCommandNotFound, fmt.Sprintf("command %q not found", f.CommandID)}
	case errors.Is(err, errSessionExpired):
		return nil, offs, false, &frameError{protocol.ErrSessionExpired, fmt.Sprintf("command %q has expired", f.CommandID)}
	case err != nil:
		return nil, offs, false, err
	}
	<-sess.ready
	if sess.startErr != nil {
		return nil, offs, false, &frameError{protocol.ErrCommandError, sess.startErr.Error()}
	}
	sess.attach()
	return sess, offs, binary, nil
}

// execute gets or creates the session named by f.CommandID; creating it
// starts the command.
func (s *Server) execute(f protocol.ExecFrame) (*session, error) {
	if f.CommandID == "" {
		f.CommandID = newCommandID()
	}
	sess, created, err := s.sessions.getOrCreate(f.CommandID)
	if err != nil || !created {
		return sess, err
	}
	sess.killOnDisconnect = f.KillOnDisconnect
	sess.binary = f.Encoding == protocol.EncodingBase64
	sess.idle = seconds(f.IdleTimeoutSeconds, defaultIdleTimeout)
	sess.ttl = seconds(f.TTLSeconds, defaultTTL)
	sess.limit = seconds(f.TimeoutSeconds, defaultTimeout)
	spec, err := s.procSpec(f)
	var p *proc
	if err == nil {
		p, err = spawn(s.reaper, spec)
	}
	if err != nil {
		sess.startErr = err
		s.sessions.abandon(sess)
		close(sess.ready)
		return sess, nil
	}
	s.log.Debug("command started", "command_id", sess.id, "pid", p.pid)
	go sess.run(p, s.sessions.finished)
	return sess, nil
}

// seconds converts an optional protocol duration: nil gives def, a negative
// value gives -1 (never).
func seconds(v *int64, def time.Duration) time.Duration {
	switch {
	case v == nil:
		return def
	case *v < 0:
		return -1
	default:
		return time.Duration(*v) * time.Second
	}
}

// procSpec turns an execute frame into what to start: shell, identity,
// working directory and environment.
func (s *Server) procSpec(f protocol.ExecFrame) (procSpec, error) {
	var rc protocol.RunConfig
	if f.RunConfig != nil {
		if len(f.Env) > 0 || f.Cwd != "" {
			return procSpec{}, errors.New("run_config cannot be combined with the deprecated env or cwd")
		}
		rc = *f.RunConfig
	} else {
		rc = protocol.RunConfig{EnvVars: f.Env, WorkDir: f.Cwd}
	}
	id, err := lookupIdentity(s.root, rc.User)
	if err != nil {
		return procSpec{}, fmt.Errorf("run_config.user: %w", err)
	}
	dir := rc.WorkDir
	switch {
	case dir == "":
		dir = id.startDir()
	case !filepath.IsAbs(dir):
		return procSpec{}, fmt.Errorf("work_dir %q must be absolute", dir)
	}
	spec := procSpec{
		shell:     pickShell(f.Shell),
		command:   f.Command,
		env:       s.commandEnv(rc.EnvVars, id, f.PTY),
		dir:       filepath.Clean(dir),
		id:        id,
		pty:       f.PTY,
		rows:      defaultRows,
		cols:      defaultCols,
		stdinPipe: !f.CloseStdin,
	}
	if f.Rows > 0 && f.Cols > 0 {
		spec.rows, spec.cols = uint16(f.Rows), uint16(f.Cols)
	}
	return spec, nil
}

// pickShell returns the requested shell if it exists in the sandbox, else
// /bin/sh (images without bash are common).
func pickShell(shell string) string {
	if shell == "" {
		shell = defaultShell
	}
	if st, err := os.Stat(shell); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
		return shell
	}
	return fallbackShell
}

// commandEnv layers a command's environment: the agent's base environment,
// then the identity's HOME/USER/LOGNAME when switching user, then the
// request's variables; PATH, HOME (and TERM under a PTY) get defaults when
// still unset. The agent token never reaches a command.
func (s *Server) commandEnv(vars map[string]string, id identity, pty bool) []string {
	env := map[string]string{}
	for _, kv := range s.baseEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	if id.change {
		env["HOME"] = id.home
		if id.name != "" {
			env["USER"], env["LOGNAME"] = id.name, id.name
		}
	}
	for k, v := range vars {
		env[k] = v
	}
	defaults := map[string]string{"PATH": defaultPath, "HOME": id.home}
	if pty {
		defaults["TERM"] = "xterm-256color"
	}
	for k, v := range defaults {
		if _, ok := env[k]; !ok {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// readClient applies the client's frames to the session until the
// connection ends, then cancels the stream. On a binary connection input
// data is base64; input that does not decode is dropped like a malformed
// frame.
func (s *Server) readClient(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn, sess *session, binary bool) {
	defer cancel()
	for {
		f, err := readFrame(ctx, c)
		var fe *frameError
		if errors.As(err, &fe) {
			continue // ignore a malformed frame, keep the stream
		}
		if err != nil {
			return
		}
		switch f.Type {
		case protocol.FrameInput:
			data, err := protocol.FrameData(f, binary)
			if err != nil {
				s.log.Warn("bad input frame", "command_id", sess.id, "err", err)
				continue
			}
			sess.writeInput(data)
		case protocol.FrameCloseStdin:
			sess.closeStdin()
		case protocol.FrameKill:
			sess.kill()
		case protocol.FrameResize:
			if err := sess.resize(f.Rows, f.Cols); err != nil {
				s.log.Warn("resize failed", "command_id", sess.id, "err", err)
			}
		}
	}
}

// keepalive pings the client every pingInterval so proxies keep a silent
// stream open; a failed ping ends the connection.
func keepalive(ctx context.Context, cancel context.CancelFunc, c *websocket.Conn) {
	t := time.NewTicker(pingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, pcancel := context.WithTimeout(ctx, pingInterval)
			err := c.Ping(pctx)
			pcancel()
			if err != nil {
				cancel()
				return
			}
		}
	}
}

// stream sends the session's output from offs until it is done, then the
// final exit (or CommandTimeout error) frame. All output precedes it. A
// binary stream sends the window's bytes as they are, base64-encoded; a
// text one never splits a UTF-8 sequence across frames.
func (s *session) stream(ctx context.Context, c *websocket.Conn, offs [2]int64, binary bool) error {
	s.mu.Lock()
	s.readers[&offs] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.readers, &offs)
		s.space.Broadcast()
		s.mu.Unlock()
	}()
	for {
		var frames []protocol.ExecFrame
		s.mu.Lock()
		for i := range s.out {
			limit := maxFrameData
			if binary {
				limit = maxBinaryFrameData
			}
			p, off := s.out[i].from(offs[i], limit, binary)
			if len(p) > 0 {
				typ := protocol.FrameStdout
				if i == streamStderr {
					typ = protocol.FrameStderr
				}
				data := string(p)
				if binary {
					data = base64.StdEncoding.EncodeToString(p)
				}
				frames = append(frames, protocol.ExecFrame{Type: typ, Data: data, Offset: &off})
				offs[i] = off + int64(len(p))
			}
		}
		if len(frames) > 0 {
			s.space.Broadcast() // this reader advanced: pumps may have room
		}
		done, code, timedOut, changed := s.done, s.exitCode, s.timedOut, s.changed
		s.mu.Unlock()
		for _, f := range frames {
			if err := writeFrame(ctx, c, f); err != nil {
				return err
			}
		}
		switch {
		case len(frames) > 0:
			continue
		case done && timedOut:
			return writeFrame(ctx, c, protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrCommandTimeout, Error: fmt.Sprintf("command timed out after %v", s.limit)})
		case done:
			return writeFrame(ctx, c, protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &code})
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func readFrame(ctx context.Context, c *websocket.Conn) (protocol.ExecFrame, error) {
	var f protocol.ExecFrame
	_, data, err := c.Read(ctx)
	if err != nil {
		return f, fmt.Errorf("read frame: %w", err)
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return f, &frameError{protocol.ErrCommandError, "invalid frame: " + err.Error()}
	}
	return f, nil
}

func writeFrame(ctx context.Context, c *websocket.Conn, f protocol.ExecFrame) error {
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if err := c.Write(wctx, websocket.MessageText, data); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

package cubicle

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ExecRequest describes one streamed command. Only Command is required.
type ExecRequest struct {
	// Command is run as `<Shell> -c <Command>`.
	Command string
	// Shell defaults to the server's (/bin/bash in the protocol).
	Shell string
	// Timeout is a hard limit on the command's run time, rounded up to whole
	// seconds; 0 means the server's default (60 s in the protocol) and a
	// negative value means no limit.
	Timeout time.Duration
	// Env and Cwd are the protocol's deprecated per-command settings; do not
	// combine them with RunConfig.
	Env       map[string]string
	Cwd       string
	RunConfig *protocol.RunConfig

	// Stdin, when non-nil, is forwarded as input frames; its EOF half-closes
	// the command's stdin (except under a PTY, where the command sees EOF
	// when the input carries ^D). When nil the command starts with a closed
	// stdin. Exec does not wait for a Read on Stdin that blocks past the
	// command's exit.
	//
	// Stdin, Stdout and Stderr carry bytes exactly: Exec asks for the
	// protocol's base64 extension (protocol.EncodingBase64), which Cubicle
	// servers answer. A server that does not (text frames) needs UTF-8
	// text: invalid bytes arrive as U+FFFD.
	Stdin io.Reader
	// Stdout and Stderr receive the command's output, each exactly once and
	// in order even across reconnects. Nil discards. Under a PTY all output
	// arrives on Stdout.
	Stdout, Stderr io.Writer

	// PTY runs the command on a pseudo-terminal of Rows×Cols (server default
	// when zero); sizes from Resize are forwarded as they come.
	PTY        bool
	Rows, Cols int
	Resize     <-chan WindowSize

	// OnStart, when set, is called once with the command's process id
	// (0 if the server did not say) when the server has started it,
	// before any of its output is delivered.
	OnStart func(pid int)
	// Kill, when non-nil, kills the command when it is closed or
	// receives; Exec then returns the exit code the server reports for
	// the killed command (cancelling ctx kills too, but returns ctx's
	// error).
	Kill <-chan struct{}

	// CommandID names the command on the server; reusing an id attaches to
	// the existing command instead of starting a second one. Empty means a
	// fresh UUIDv7.
	CommandID string
}

// WindowSize is a terminal size in character cells.
type WindowSize struct{ Rows, Cols int }

// Exec runs req.Command in the sandbox over the exec WebSocket, streaming
// output to req.Stdout and req.Stderr as it arrives, and returns the exit
// code. A non-zero exit code is not an error.
//
// If the socket drops after the command started, Exec reconnects with the
// byte offsets it has delivered and the server resumes from there; chunks it
// has already seen are skipped, so output is never duplicated. It gives up
// after 5 consecutive failed attempts. Cancelling ctx kills the command
// (best effort: a kill frame on the open connection; between connections the
// server's idle timeout reaps it).
//
// A timeout returns an error for which errors.Is(err, ErrCommandTimeout)
// holds; other server-side failures are *ExecError or *APIError.
func (c *Client) Exec(ctx context.Context, sandboxName string, req ExecRequest) (int, error) {
	dp, err := c.dataplaneURL(ctx, sandboxName)
	if err != nil {
		return -1, err
	}
	s := &execSession{
		c:      c,
		url:    dp + "/execute/ws",
		req:    req,
		id:     req.CommandID,
		connCh: make(chan struct{}),
	}
	if s.id == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return -1, fmt.Errorf("exec in sandbox %q: command id: %w", sandboxName, err)
		}
		s.id = id.String()
	}
	code, err := s.run(ctx)
	if err != nil {
		return -1, fmt.Errorf("exec in sandbox %q: %w", sandboxName, err)
	}
	return code, nil
}

// maxExecAttempts bounds consecutive failed connections (spec §6.4).
const maxExecAttempts = 5

// execSession is one command's stream across any number of connections.
// Offsets count the bytes already written to Stdout and Stderr; only the
// read loop of the current attempt touches them. conn is the connection that
// has acknowledged the command (seen "started"), nil between connections.
type execSession struct {
	c   *Client
	url string
	req ExecRequest
	id  string

	outOff, errOff int64
	acked          bool // some connection has answered "started" (OnStart was called then)
	pumpsStarted   bool

	mu         sync.Mutex
	conn       *websocket.Conn
	connBinary bool          // conn agreed to base64 data
	connCh     chan struct{} // closed and replaced whenever conn is set
}

// errRetry wraps a failure after which a new connection may succeed.
type errRetry struct {
	err       error
	immediate bool // server going away (1001): reconnect without backoff
}

func (e *errRetry) Error() string { return e.err.Error() }
func (e *errRetry) Unwrap() error { return e.err }

func (s *execSession) run(ctx context.Context) (int, error) {
	// The pumps outlive one attempt; cancelling pumpCtx stops them.
	pumpCtx, stopPumps := context.WithCancel(ctx)
	defer stopPumps()
	failures := 0
	for {
		code, progressed, err := s.attempt(ctx, pumpCtx)
		if err == nil {
			return code, nil
		}
		if ctx.Err() != nil {
			return -1, ctx.Err()
		}
		var re *errRetry
		if !errors.As(err, &re) {
			return -1, err
		}
		if progressed {
			failures = 0
		}
		failures++
		if failures >= maxExecAttempts {
			return -1, fmt.Errorf("giving up after %d attempts: %w", failures, re.err)
		}
		if re.immediate {
			continue
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(s.c.reconnectDelay(failures)):
		}
	}
}

// attempt runs one connection: dial, send execute (or reconnect once the
// command is known to exist), then read frames until exit, error or a drop.
// progressed reports whether the server acknowledged or sent output, which
// resets the failure budget.
func (s *execSession) attempt(ctx, pumpCtx context.Context) (code int, progressed bool, err error) {
	conn, err := s.dial(ctx)
	if err != nil {
		return -1, false, err
	}
	defer conn.CloseNow()
	// Reads use a context that ctx cannot cancel, because coder/websocket
	// closes the connection when a Read's context ends, and a cancelled
	// Exec must first tell the server to kill the command.
	stop := context.AfterFunc(ctx, func() { s.kill(conn) })
	defer stop()
	defer s.clearConn(conn)

	if err := writeFrame(ctx, conn, s.firstFrame()); err != nil {
		return -1, false, &errRetry{err: fmt.Errorf("send %s: %w", s.firstFrame().Type, err)}
	}
	readCtx := context.WithoutCancel(ctx)
	binary := false // until this connection's started says otherwise
	for {
		_, msg, err := conn.Read(readCtx)
		if err != nil {
			return -1, progressed, dropError(err)
		}
		var f protocol.ExecFrame
		if err := json.Unmarshal(msg, &f); err != nil {
			return -1, progressed, fmt.Errorf("bad frame from server: %w", err)
		}
		switch f.Type {
		case protocol.FrameStarted:
			if f.CommandID != "" && f.CommandID != s.id {
				continue // an ack for someone else's command: ignore, as the official client does
			}
			progressed = true
			first := !s.acked
			s.acked = true
			binary = f.Encoding == protocol.EncodingBase64
			s.setConn(conn, binary)
			if first && s.req.OnStart != nil {
				s.req.OnStart(f.PID)
			}
			s.startPumps(pumpCtx)
		case protocol.FrameStdout, protocol.FrameStderr:
			progressed = true
			if err := s.deliver(f, binary); err != nil {
				s.kill(conn)
				return -1, progressed, err
			}
		case protocol.FrameExit:
			code := -1
			if f.ExitCode != nil {
				code = *f.ExitCode
			}
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return code, progressed, nil
		case protocol.FrameError:
			typ := f.ErrorType
			if typ == "" {
				typ = protocol.ErrCommandError
			}
			return -1, progressed, &ExecError{Type: typ, Message: f.Error}
		}
		// Other frame types (heartbeats, extensions) are ignored.
	}
}

// dial opens a connection. A non-101 answer of 429 or 5xx, or a network
// failure, is worth retrying; any other status is final.
func (s *execSession) dial(ctx context.Context) (*websocket.Conn, error) {
	h := http.Header{}
	s.c.setHeaders(h)
	conn, resp, err := websocket.Dial(ctx, s.url, &websocket.DialOptions{
		HTTPClient: s.c.http,
		HTTPHeader: h,
	})
	if err == nil {
		// Output frames can be large; the library's default limit is 32 KiB.
		conn.SetReadLimit(64 << 20)
		return conn, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return nil, &errRetry{err: fmt.Errorf("connect: %w", err)}
	}
	body, _ := io.ReadAll(resp.Body)
	ae := parseError(resp.StatusCode, body)
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return nil, &errRetry{err: fmt.Errorf("connect: %w", ae)}
	}
	return nil, fmt.Errorf("connect: %w", ae)
}

// dropError classifies a failed Read. Every drop is retryable: a command id
// is get-or-create on the server, so even a drop before "started" may safely
// re-send execute with the same id.
func dropError(err error) error {
	immediate := websocket.CloseStatus(err) == websocket.StatusGoingAway
	return &errRetry{err: fmt.Errorf("stream dropped: %w", err), immediate: immediate}
}

// firstFrame is execute for a command the server has not acknowledged yet,
// and reconnect with the delivered offsets afterwards. Both ask for the
// binary-safe encoding.
func (s *execSession) firstFrame() protocol.ExecFrame {
	if s.acked {
		return protocol.ExecFrame{
			Type:         protocol.FrameReconnect,
			CommandID:    s.id,
			StdoutOffset: s.outOff,
			StderrOffset: s.errOff,
			Encoding:     protocol.EncodingBase64,
		}
	}
	r := s.req
	f := protocol.ExecFrame{
		Type:       protocol.FrameExecute,
		CommandID:  s.id,
		Command:    r.Command,
		Shell:      r.Shell,
		Env:        r.Env,
		Cwd:        r.Cwd,
		RunConfig:  r.RunConfig,
		CloseStdin: r.Stdin == nil && !r.PTY,
		PTY:        r.PTY,
		Rows:       r.Rows,
		Cols:       r.Cols,
		Encoding:   protocol.EncodingBase64,
	}
	switch {
	case r.Timeout > 0:
		secs := int64((r.Timeout + time.Second - 1) / time.Second)
		f.TimeoutSeconds = &secs
	case r.Timeout < 0:
		none := int64(0) // the agent reads 0 as "no limit"
		f.TimeoutSeconds = &none
	}
	return f
}

// deliver writes the part of an output frame not yet delivered. A frame
// starting past the delivered offset means the server's buffer no longer
// held the gap; the stream continues from the frame. binary says the
// connection's data is base64.
func (s *execSession) deliver(f protocol.ExecFrame, binary bool) error {
	w, off := s.req.Stdout, &s.outOff
	if f.Type == protocol.FrameStderr {
		w, off = s.req.Stderr, &s.errOff
	}
	data, err := protocol.FrameData(f, binary)
	if err != nil {
		return fmt.Errorf("bad frame from server: %w", err)
	}
	var start int64
	if f.Offset != nil {
		start = *f.Offset
	}
	end := start + int64(len(data))
	if end <= *off {
		return nil
	}
	if start < *off {
		data = data[*off-start:]
	}
	*off = end
	if w == nil {
		return nil
	}
	if _, err := w.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", f.Type, err)
	}
	return nil
}

// kill asks the server to kill the command (best effort) and drops conn.
func (s *execSession) kill(conn *websocket.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = writeFrame(ctx, conn, protocol.ExecFrame{Type: protocol.FrameKill})
	_ = conn.CloseNow()
}

func (s *execSession) setConn(conn *websocket.Conn, binary bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn, s.connBinary = conn, binary
	close(s.connCh)
	s.connCh = make(chan struct{})
}

func (s *execSession) clearConn(conn *websocket.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == conn {
		s.conn = nil
	}
}

// send writes f on the current acknowledged connection, waiting across
// reconnects. An input frame carries input, encoded as that connection
// agreed. A frame whose write failed is sent again on the next
// connection, so input may in rare cases arrive twice; the protocol has no
// offsets for input.
func (s *execSession) send(ctx context.Context, f protocol.ExecFrame, input []byte) error {
	for {
		s.mu.Lock()
		conn, binary, ch := s.conn, s.connBinary, s.connCh
		s.mu.Unlock()
		if conn != nil {
			if f.Type == protocol.FrameInput {
				f.Data = string(input)
				if binary {
					f.Data = base64.StdEncoding.EncodeToString(input)
				}
			}
			if err := writeFrame(ctx, conn, f); err == nil {
				return nil
			}
			s.clearConn(conn)
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// startPumps starts, once, the goroutines that forward stdin, window
// sizes and a kill. They run until their source ends or the session is over.
func (s *execSession) startPumps(ctx context.Context) {
	if s.pumpsStarted {
		return
	}
	s.pumpsStarted = true
	if s.req.Stdin != nil {
		go s.pumpStdin(ctx)
	}
	if s.req.Kill != nil {
		go func() {
			select {
			case <-ctx.Done():
			case <-s.req.Kill:
				_ = s.send(ctx, protocol.ExecFrame{Type: protocol.FrameKill}, nil)
			}
		}()
	}
	if s.req.PTY && s.req.Resize != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case ws, ok := <-s.req.Resize:
					if !ok {
						return
					}
					_ = s.send(ctx, protocol.ExecFrame{Type: protocol.FrameResize, Rows: ws.Rows, Cols: ws.Cols}, nil)
				}
			}
		}()
	}
}

// pumpStdin forwards Stdin as input frames, then half-closes stdin at EOF
// (not under a PTY, where the protocol ignores close_stdin). Over text
// frames it never splits a UTF-8 sequence across two frames.
func (s *execSession) pumpStdin(ctx context.Context) {
	s.mu.Lock()
	binary := s.connBinary
	s.mu.Unlock()
	// Small text frames: JSON escaping can grow data up to 6x, and servers
	// built on coder/websocket refuse messages over 32 KiB by default. A
	// server that agreed to base64 is Cubicle, which takes bigger ones.
	size := 4 << 10
	if binary {
		size = binaryInputChunk
	}
	buf := make([]byte, size)
	var pending []byte
	for {
		n, err := s.req.Stdin.Read(buf)
		if ctx.Err() != nil {
			return
		}
		pending = append(pending, buf[:n]...)
		cut := len(pending)
		if err == nil && !binary {
			cut = utf8Boundary(pending)
		}
		if cut > 0 {
			if s.send(ctx, protocol.ExecFrame{Type: protocol.FrameInput}, pending[:cut]) != nil {
				return
			}
			pending = append(pending[:0], pending[cut:]...)
		}
		if err != nil {
			if !s.req.PTY {
				_ = s.send(ctx, protocol.ExecFrame{Type: protocol.FrameCloseStdin}, nil)
			}
			return
		}
	}
}

// binaryInputChunk is the most stdin one binary input frame carries.
const binaryInputChunk = 64 << 10

// utf8Boundary returns the length of b without a trailing incomplete UTF-8
// sequence (at most 3 bytes are held back).
func utf8Boundary(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		c := b[i]
		if c < 0x80 {
			return len(b) // ASCII: complete
		}
		if c >= 0xC0 { // lead byte: is its sequence complete?
			need := 2
			switch {
			case c >= 0xF0:
				need = 4
			case c >= 0xE0:
				need = 3
			}
			if len(b)-i < need {
				return i
			}
			return len(b)
		}
	}
	return len(b)
}

func writeFrame(ctx context.Context, conn *websocket.Conn, f protocol.ExecFrame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return conn.Write(ctx, websocket.MessageText, b)
}

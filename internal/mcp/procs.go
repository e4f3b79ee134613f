package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// Bounds of the command table (one per MCP session).
const (
	// retainBytes is how much of each output stream a command keeps: the
	// most recent bytes; older ones are dropped and their offsets stay
	// counted.
	retainBytes = 1 << 20
	// maxCommands is how many commands (running or finished) a session
	// keeps; the oldest finished one makes room for a new one.
	maxCommands = 32
	// maxRunning is how many commands a session may have running at once.
	maxRunning = 8
)

// errNoCommand is a command id the session does not know.
var errNoCommand = errors.New("no such command in this session (ids come from run_command or start_command; finished commands are forgotten oldest first)")

// stream is one output stream of a command: the last retainBytes bytes it
// wrote, buf holding the bytes at offsets [start, start+len(buf)).
type stream struct {
	buf   []byte
	start int64
}

func (s *stream) total() int64 { return s.start + int64(len(s.buf)) }

func (s *stream) write(p []byte) {
	s.buf = append(s.buf, p...)
	if over := len(s.buf) - retainBytes; over > 0 {
		s.buf = append(s.buf[:0:0], s.buf[over:]...)
		s.start += int64(over)
	}
}

// page is up to max bytes of s from off: the bytes, the offset they start
// at (later than off when off was dropped) and whether more follow. A page
// that ends inside a UTF-8 sequence ends before it, so the next page
// starts with the whole character.
func (s *stream) page(off int64, max int) (b []byte, from int64, more bool) {
	from = min(max64(off, s.start), s.total())
	end := min(from+int64(max), s.total())
	i, j := int(from-s.start), int(end-s.start)
	if end < s.total() {
		j = i + utf8Cut(s.buf[i:j])
	}
	return s.buf[i:j], from, s.start+int64(j) < s.total()
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// proc is one command run through the session. Its streams, exit and
// changed are guarded by mu; changed is closed and replaced whenever
// output arrives or the command ends, to wake waiting readers.
type proc struct {
	id, sandbox, command string
	started              time.Time
	cancel               context.CancelFunc
	done                 chan struct{}
	stdin                *io.PipeWriter // nil when the command has no stdin

	mu             sync.Mutex
	stdout, stderr stream
	changed        chan struct{}
	exitCode       *int
	failure        string // how it ended without an exit code
	killed         bool
	// refused is the API's answer when the command never ran (no such
	// sandbox, no access, not ready).
	refused error
}

// procWriter is one of a proc's output streams as an io.Writer.
type procWriter struct {
	p   *proc
	err bool
}

func (w procWriter) Write(b []byte) (int, error) {
	p := w.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if w.err {
		p.stderr.write(b)
	} else {
		p.stdout.write(b)
	}
	p.wake()
	return len(b), nil
}

// wake tells waiting readers something changed; p.mu is held.
func (p *proc) wake() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *proc) finish(code int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.exitCode = &code // a killed command may still report one
	}
	switch {
	case p.killed:
		p.failure = "killed by kill_command"
	case err == nil:
	case errors.Is(err, cubicle.ErrCommandTimeout):
		p.failure = "timed out and was killed"
	case errors.As(err, new(*cubicle.APIError)):
		p.refused, p.failure = err, err.Error()
	default:
		p.failure = err.Error()
	}
	p.wake()
	close(p.done)
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// procs is a session's command table. Commands run on base, so they
// outlive the tool call that started them and end with the session.
type procs struct {
	c    *cubicle.Client
	base context.Context
	stop context.CancelFunc

	mu    sync.Mutex
	byID  map[string]*proc
	order []*proc // oldest first
}

func newProcs(c *cubicle.Client) *procs {
	base, stop := context.WithCancel(context.Background())
	return &procs{c: c, base: base, stop: stop, byID: map[string]*proc{}}
}

// start runs req in sandbox. With interactive, the command's stdin stays
// open for send_input; otherwise it starts closed.
func (t *procs) start(sandbox string, req cubicle.ExecRequest, interactive bool) (*proc, error) {
	p := &proc{id: uuid.NewString(), sandbox: sandbox, command: req.Command, started: time.Now(),
		done: make(chan struct{}), changed: make(chan struct{})}
	if err := t.admit(p); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(t.base)
	p.cancel = cancel
	req.CommandID = p.id
	req.Stdout, req.Stderr = procWriter{p: p}, procWriter{p: p, err: true}
	var stdinR *io.PipeReader
	if interactive {
		stdinR, p.stdin = io.Pipe()
		req.Stdin = stdinR
	}
	go func() {
		defer cancel()
		code, err := t.c.Exec(ctx, sandbox, req)
		if stdinR != nil {
			// A send_input after the end fails instead of blocking.
			stdinR.CloseWithError(errors.New("the command has ended"))
		}
		p.finish(code, err)
	}()
	return p, nil
}

// admit adds p to the table, making room by forgetting the oldest
// finished command.
func (t *procs) admit(p *proc) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.base.Err() != nil {
		return errors.New("the session is closing")
	}
	running := 0
	for _, q := range t.order {
		if q.running() {
			running++
		}
	}
	if running >= maxRunning {
		return fmt.Errorf("%d commands are already running in this session: wait for one or kill_command it", running)
	}
	if len(t.order) >= maxCommands {
		for i, q := range t.order {
			if !q.running() {
				delete(t.byID, q.id)
				t.order = append(t.order[:i:i], t.order[i+1:]...)
				break
			}
		}
	}
	t.byID[p.id] = p
	t.order = append(t.order, p)
	return nil
}

func (t *procs) get(id string) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.byID[id]
	if !ok {
		return nil, fmt.Errorf("command %q: %w", id, errNoCommand)
	}
	return p, nil
}

// close kills every running command and waits (briefly) for them to end.
func (t *procs) close() {
	t.stop()
	t.mu.Lock()
	order := t.order
	t.mu.Unlock()
	deadline := time.After(5 * time.Second)
	for _, p := range order {
		select {
		case <-p.done:
		case <-deadline:
			return
		}
	}
}

// kill ends p's command (the server kills it) and waits up to wait for
// the end to be reported.
func (p *proc) kill(wait time.Duration) {
	p.mu.Lock()
	if p.exitCode == nil && p.failure == "" {
		p.killed = true
	}
	p.mu.Unlock()
	p.cancel()
	select {
	case <-p.done:
	case <-time.After(wait):
	}
}

// wait blocks until p has output past the given offsets, has ended, or d
// or ctx runs out.
func (p *proc) wait(ctx context.Context, stdoutOff, stderrOff int64, d time.Duration) {
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		p.mu.Lock()
		ready := p.stdout.total() > stdoutOff || p.stderr.total() > stderrOff || !p.running()
		ch := p.changed
		p.mu.Unlock()
		if ready {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// send writes input to p's stdin, then closes it when closeStdin.
func (p *proc) send(ctx context.Context, input string, closeStdin bool) error {
	if p.stdin == nil {
		return errors.New("this command has no open stdin (start it with start_command)")
	}
	errc := make(chan error, 1)
	go func() {
		var err error
		if input != "" {
			_, err = io.WriteString(p.stdin, input)
		}
		if err == nil && closeStdin {
			err = p.stdin.Close()
		}
		errc <- err
	}()
	select {
	case err := <-errc:
		if err != nil {
			return fmt.Errorf("send input: %w", err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return errors.New("send input: the command did not read its input within 30 s")
	}
}

// refusal is the API's refusal of p's command, nil if it ran.
func (p *proc) refusal() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// output is one page of p's output as the tools return it.
func (p *proc) output(stdoutOff, stderrOff int64, max int) CommandOutput {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := CommandOutput{CommandID: p.id, Sandbox: p.sandbox, Running: p.running(), ExitCode: p.exitCode, Error: p.failure}
	var b []byte
	b, out.StdoutOffset, out.StdoutTruncated = p.stdout.page(stdoutOff, max)
	out.Stdout = text(b)
	out.NextStdoutOffset, out.StdoutBytes = out.StdoutOffset+int64(len(b)), p.stdout.total()
	out.StdoutTruncated = out.StdoutTruncated || out.StdoutOffset > stdoutOff
	b, out.StderrOffset, out.StderrTruncated = p.stderr.page(stderrOff, max)
	out.Stderr = text(b)
	out.NextStderrOffset, out.StderrBytes = out.StderrOffset+int64(len(b)), p.stderr.total()
	out.StderrTruncated = out.StderrTruncated || out.StderrOffset > stderrOff
	return out
}

// text renders output bytes as a JSON-safe string: invalid UTF-8 becomes
// U+FFFD.
func text(b []byte) string { return strings.ToValidUTF8(string(b), "\uFFFD") }

package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/e2b/envd/process"
	"github.com/cubicle-dev/cubicle/internal/e2b/envd/process/processconnect"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// processService is envd's process.Process over Cubicle's exec WebSocket:
// each process is one Exec the door runs detached from the RPC that
// started it, so a background command outlives its Start stream and can be
// joined again with Connect.
type processService struct {
	processconnect.UnimplementedProcessHandler
	d *Door
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// proc is one process started through the door. Its events go to every
// subscriber in order; the end event is the last, after which the process
// leaves the table.
type proc struct {
	pid   uint32
	owner string // the key that started it: only that key may see or drive it
	info  *process.ProcessInfo

	began    bool           // the server started the command (run's goroutine only)
	stdin    *io.PipeWriter // nil when started without stdin
	kill     chan struct{}
	killOnce sync.Once
	resize   chan cubicle.WindowSize

	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

// subscriber receives a process's events until gone is closed.
type subscriber struct {
	ch   chan *process.ProcessEvent
	gone chan struct{}
}

func (p *proc) subscribe() *subscriber {
	s := &subscriber{ch: make(chan *process.ProcessEvent, 16), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// publish hands ev to every subscriber, waiting for each (output is
// backpressured to the command rather than buffered without bound).
func (p *proc) publish(ev *process.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// output is a writer publishing data events built by mk.
type output func(b []byte) *process.ProcessEvent_DataEvent

func (p *proc) writer(mk output) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: mk(append([]byte(nil), b...))}})
		return len(b), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func stdoutData(b []byte) *process.ProcessEvent_DataEvent {
	return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

func stderrData(b []byte) *process.ProcessEvent_DataEvent {
	return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: b}}
}

func ptyData(b []byte) *process.ProcessEvent_DataEvent {
	return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: b}}
}

func (t *procTable) add(box string, p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.pid == 0 {
		t.next++
		p.pid = t.next
	}
	p.info.Pid = p.pid
	m := t.boxes[box]
	if m == nil {
		m = map[uint32]*proc{}
		t.boxes[box] = m
	}
	m[p.pid] = p
}

func (t *procTable) remove(box string, pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.boxes[box], pid)
	if len(t.boxes[box]) == 0 {
		delete(t.boxes, box)
	}
}

// find returns the process sel names in box, if key started it.
func (t *procTable) find(box, key string, sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.boxes[box] {
		if p.owner != key {
			continue
		}
		switch s := sel.GetSelector().(type) {
		case *process.ProcessSelector_Pid:
			if p.pid == s.Pid {
				return p, nil
			}
		case *process.ProcessSelector_Tag:
			if p.info.GetTag() == s.Tag {
				return p, nil
			}
		}
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found", selectorString(sel)))
}

func selectorString(sel *process.ProcessSelector) string {
	if tag, ok := sel.GetSelector().(*process.ProcessSelector_Tag); ok {
		return "with tag " + strconv.Quote(tag.Tag)
	}
	return strconv.FormatUint(uint64(sel.GetPid()), 10)
}

func (t *procTable) list(box, key string) []*process.ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*process.ProcessInfo
	for _, p := range t.boxes[box] {
		if p.owner == key {
			out = append(out, p.info)
		}
	}
	return out
}

// shells are the programs whose "-c SCRIPT" (or "-l -c SCRIPT") is run as
// Cubicle's shell and command, so the audit record shows the script.
var shells = map[string]bool{"sh": true, "bash": true, "dash": true, "ash": true, "zsh": true}

// commandLine maps an envd command (a program and its arguments) onto
// Cubicle's exec (a shell and a command line for it).
func commandLine(cmd string, args []string) (shell, command string) {
	if shells[path.Base(cmd)] {
		switch {
		case len(args) == 2 && args[0] == "-c":
			return cmd, args[1]
		case len(args) == 3 && args[1] == "-c" && (args[0] == "-l" || args[0] == "--login"):
			return cmd, args[2]
		}
	}
	words := []string{"exec", shellQuote(cmd)}
	for _, a := range args {
		words = append(words, shellQuote(a))
	}
	return "/bin/sh", strings.Join(words, " ")
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// requestUser is the user an envd request names in its Basic
// Authorization ("user:"), or "" for the sandbox's own.
func requestUser(h http.Header) string {
	v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return ""
	}
	user, _, _ := strings.Cut(string(b), ":")
	return user
}

// Start runs a process and streams its events: start (with the pid),
// output, end.
func (s *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return rpcError(err)
	}
	m := req.Msg
	cfg := m.GetProcess()
	shell, command := commandLine(cfg.GetCmd(), cfg.GetArgs())
	p := &proc{owner: t.key, kill: make(chan struct{}), resize: make(chan cubicle.WindowSize, 1), subs: map[*subscriber]struct{}{},
		info: &process.ProcessInfo{Config: cfg, Tag: m.Tag}}
	er := cubicle.ExecRequest{Command: command, Shell: shell, Kill: p.kill, Timeout: -1,
		RunConfig: &protocol.RunConfig{User: requestUser(req.Header()), WorkDir: cfg.GetCwd(), EnvVars: cfg.GetEnvs()}}
	if dl, ok := ctx.Deadline(); ok {
		er.Timeout = max(time.Until(dl), time.Second)
	}
	if m.Pty != nil {
		er.PTY, er.Rows, er.Cols, er.Resize = true, int(m.Pty.GetSize().GetRows()), int(m.Pty.GetSize().GetCols()), p.resize
		er.Stdout = p.writer(ptyData)
	} else {
		er.Stdout, er.Stderr = p.writer(stdoutData), p.writer(stderrData)
	}
	if m.GetStdin() || m.Pty != nil {
		var r *io.PipeReader
		r, p.stdin = io.Pipe()
		er.Stdin = r
	}
	sub := p.subscribe()
	started := make(chan error, 1)
	er.OnStart = func(pid int) {
		p.began, p.pid = true, uint32(pid)
		s.d.procs.add(t.id, p)
		started <- nil
	}
	go s.run(t, p, er, started)
	select {
	case err := <-started:
		if err != nil {
			p.unsubscribe(sub)
			return rpcError(err)
		}
	case <-ctx.Done():
		p.unsubscribe(sub)
		p.killOnce.Do(func() { close(p.kill) })
		return rpcError(ctx.Err())
	}
	return forward(ctx, req.Header(), p, sub, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

// run runs p's command to its end and publishes the end event. A command
// that fails before it starts reports on started instead.
func (s *processService) run(t *sandboxTarget, p *proc, er cubicle.ExecRequest, started chan<- error) {
	code, err := t.c.Exec(context.Background(), t.name, er)
	if !p.began {
		if err == nil {
			err = errors.New("command ended before it started")
		}
		started <- err
		return
	}
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(code), Exited: err == nil && code >= 0, Status: "exit status " + strconv.Itoa(code)}
	if err != nil {
		msg := err.Error()
		end.ExitCode, end.Error, end.Status = -1, &msg, "error"
		s.d.cfg.Logger.Warn("e2b process failed", "sandbox", t.name, "pid", p.pid, "err", err)
	}
	if p.stdin != nil {
		_ = p.stdin.CloseWithError(errors.New("process ended"))
	}
	s.d.procs.remove(t.id, p.pid)
	p.publish(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}})
}

// forward sends sub's events (after a start event naming p) until the end
// event, sending keepalives at the interval the client asked for.
func forward(ctx context.Context, h http.Header, p *proc, sub *subscriber, send func(*process.ProcessEvent) error) error {
	defer p.unsubscribe(sub)
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return err
	}
	keep := keepalive(h)
	defer keep.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		case <-keep.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return rpcError(ctx.Err())
		}
	}
}

// keepalive ticks at the Keepalive-Ping-Interval (seconds) the SDKs send,
// or once an hour without one.
func keepalive(h http.Header) *time.Ticker {
	d := time.Hour
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		d = time.Duration(n) * time.Second
	}
	return time.NewTicker(d)
}

// lookup resolves the sandbox and the process a request names.
func (s *processService) lookup(ctx context.Context, h http.Header, sel *process.ProcessSelector) (*proc, error) {
	t, err := s.d.target(ctx, h)
	if err != nil {
		return nil, rpcError(err)
	}
	return s.d.procs.find(t.id, t.key, sel)
}

// Connect joins a running process's event stream (from now on).
func (s *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := s.lookup(ctx, req.Header(), req.Msg.GetProcess())
	if err != nil {
		return err
	}
	return forward(ctx, req.Header(), p, p.subscribe(), func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}

// List lists the running processes the caller started.
func (s *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t, err := s.d.target(ctx, req.Header())
	if err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&process.ListResponse{Processes: s.d.procs.list(t.id, t.key)}), nil
}

// SendInput writes to a process's stdin (or its terminal).
func (s *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := s.lookup(ctx, req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.write(ctx, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// write feeds in to p's stdin, waiting for the command to take it.
func (p *proc) write(ctx context.Context, in *process.ProcessInput) error {
	if p.stdin == nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("process was started without stdin"))
	}
	data := in.GetStdin()
	if data == nil {
		data = in.GetPty()
	}
	done := make(chan error, 1)
	go func() { _, err := p.stdin.Write(data); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("write stdin: %w", err))
		}
		return nil
	case <-ctx.Done():
		return rpcError(ctx.Err())
	}
}

// StreamInput feeds a stream of input to the process its first message
// names.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, err := s.lookup(ctx, stream.RequestHeader(), ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("input before the start event"))
			}
			if err := p.write(ctx, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}

// CloseStdin closes a process's stdin: the command reads EOF.
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := s.lookup(ctx, req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.stdin == nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process was started without stdin"))
	}
	_ = p.stdin.Close()
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

// SendSignal kills the process: Cubicle's exec has one way to stop a
// command, so SIGTERM and SIGKILL both kill it.
func (s *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	p, err := s.lookup(ctx, req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL, process.Signal_SIGNAL_SIGTERM:
		p.killOnce.Do(func() { close(p.kill) })
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v is not supported", req.Msg.GetSignal()))
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// Update resizes a process's terminal.
func (s *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := s.lookup(ctx, req.Header(), req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		ws := cubicle.WindowSize{Rows: int(size.GetRows()), Cols: int(size.GetCols())}
		select {
		case <-p.resize: // a newer size replaces one not yet sent
		default:
		}
		select {
		case p.resize <- ws:
		default: // a concurrent Update's size won
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

package e2b

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/e2b/envd/process"
	"github.com/cubicle-dev/cubicle/internal/e2b/envd/process/processconnect"
)

// processClient is an envd process client as the SDKs call it: every
// request names the sandbox and carries the key as X-Access-Token.
func processClient(t *testing.T, url, sandbox, key string) processconnect.ProcessClient {
	t.Helper()
	return processconnect.NewProcessClient(http.DefaultClient, url, connect.WithInterceptors(headers(sandbox, key)))
}

// headers is an interceptor setting the envd routing and auth headers.
func headers(sandbox, key string) connect.Interceptor {
	set := func(h http.Header) {
		h.Set("E2b-Sandbox-Id", sandbox)
		h.Set("E2b-Sandbox-Port", "49983")
		h.Set("X-Access-Token", key)
	}
	return interceptor{unary: func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			set(req.Header())
			return next(ctx, req)
		}
	}, stream: func(next connect.StreamingClientFunc) connect.StreamingClientFunc {
		return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
			conn := next(ctx, spec)
			set(conn.RequestHeader())
			return conn
		}
	}}
}

type interceptor struct {
	unary  func(connect.UnaryFunc) connect.UnaryFunc
	stream func(connect.StreamingClientFunc) connect.StreamingClientFunc
}

func (i interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc { return i.unary(next) }
func (i interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return i.stream(next)
}
func (i interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// events collects a process stream: the pid of its start event, its
// output and its end event.
type events struct {
	pid      uint32
	out, err strings.Builder
	end      *process.ProcessEvent_EndEvent
}

func collect(t *testing.T, next func() bool, msg func() *process.ProcessEvent, streamErr func() error) *events {
	t.Helper()
	var e events
	for next() {
		ev := msg()
		switch {
		case ev.GetStart() != nil:
			e.pid = ev.GetStart().GetPid()
		case ev.GetData() != nil:
			e.out.Write(ev.GetData().GetStdout())
			e.out.Write(ev.GetData().GetPty())
			e.err.Write(ev.GetData().GetStderr())
		case ev.GetEnd() != nil:
			e.end = ev.GetEnd()
		}
	}
	if err := streamErr(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	return &e
}

func startCmd(cmd string, args ...string) *process.StartRequest {
	return &process.StartRequest{Process: &process.ProcessConfig{Cmd: cmd, Args: args}}
}

// TestStartStreamsStartOutputEnd: a bash -l -c SCRIPT runs as Cubicle's
// shell and command (so the record shows the script), and the stream is
// start (with the server's pid), output, end with the exit code.
func TestStartStreamsStartOutputEnd(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	c := processClient(t, srv.URL, "box", keyA)
	st, err := c.Start(t.Context(), connect.NewRequest(startCmd("/bin/bash", "-l", "-c", "echo hi")))
	if err != nil {
		t.Fatal(err)
	}
	e := collect(t, st.Receive, func() *process.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if e.pid != 77 || e.out.String() != "ran:echo hi" || e.err.String() != "/bin/bash" {
		t.Errorf("pid %d stdout %q stderr %q; want 77, ran:echo hi, /bin/bash", e.pid, e.out.String(), e.err.String())
	}
	if e.end == nil || e.end.GetExitCode() != 3 || !e.end.GetExited() {
		t.Errorf("end = %v, want exit code 3", e.end)
	}
}

// TestStdinKillAndOwnership: a process started with stdin takes input and
// ends at close_stdin; a kill ends a running one with the killed exit
// code; another key (even one that sees the sandbox) cannot see or drive
// it; an unknown pid is NotFound.
func TestStdinKillAndOwnership(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	a, b := processClient(t, srv.URL, "box", keyA), processClient(t, srv.URL, "box", keyB)
	yes := true
	req := startCmd("/bin/sh", "-c", "cat")
	req.Stdin = &yes
	st, err := a.Start(t.Context(), connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	if !st.Receive() || st.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("first event = %v, %v; want start", st.Msg(), st.Err())
	}
	pid := st.Msg().GetEvent().GetStart().GetPid()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	if l, err := b.List(t.Context(), connect.NewRequest(&process.ListRequest{})); err != nil || len(l.Msg.GetProcesses()) != 0 {
		t.Errorf("List with the other key = %v, %v; want none", l, err)
	}
	_, err = b.SendInput(t.Context(), connect.NewRequest(&process.SendInputRequest{Process: sel}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("SendInput with the other key: %v, want NotFound", err)
	}
	if l, err := a.List(t.Context(), connect.NewRequest(&process.ListRequest{})); err != nil || len(l.Msg.GetProcesses()) != 1 ||
		l.Msg.GetProcesses()[0].GetConfig().GetArgs()[1] != "cat" {
		t.Errorf("List = %v, %v; want the cat", l, err)
	}
	in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("piped")}}
	if _, err := a.SendInput(t.Context(), connect.NewRequest(&process.SendInputRequest{Process: sel, Input: in})); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CloseStdin(t.Context(), connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	e := collect(t, st.Receive, func() *process.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if e.out.String() != "piped" || e.end.GetExitCode() != 0 {
		t.Errorf("stdout %q end %v; want piped, 0", e.out.String(), e.end)
	}

	sl, err := a.Start(t.Context(), connect.NewRequest(startCmd("/bin/bash", "-c", "sleep 60")))
	if err != nil || !sl.Receive() {
		t.Fatalf("start sleep: %v %v", err, sl.Err())
	}
	sel = &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: sl.Msg().GetEvent().GetStart().GetPid()}}
	joined, err := a.Connect(t.Context(), connect.NewRequest(&process.ConnectRequest{Process: sel}))
	if err != nil || !joined.Receive() || joined.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("connect: %v %v", err, joined.Err())
	}
	if _, err := a.SendSignal(t.Context(), connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL})); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*events{
		collect(t, sl.Receive, func() *process.ProcessEvent { return sl.Msg().GetEvent() }, sl.Err),
		collect(t, joined.Receive, func() *process.ProcessEvent { return joined.Msg().GetEvent() }, joined.Err),
	} {
		if s.end.GetExitCode() != 137 {
			t.Errorf("killed end = %v, want 137", s.end)
		}
	}
	_, err = a.SendSignal(t.Context(), connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("kill of an ended process: %v, want NotFound", err)
	}
}

// TestEnvdRoutingErrors: the SDKs' error classes hang on these codes: no
// sandbox header is InvalidArgument, a stopped or unknown sandbox is
// Unavailable ("timed out or killed"), a bad key Unauthenticated.
func TestEnvdRoutingErrors(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	for _, tc := range []struct {
		sandbox, key string
		want         connect.Code
	}{
		{"", keyA, connect.CodeInvalidArgument},
		{"paused-box", keyA, connect.CodeUnavailable},
		{"gone", keyA, connect.CodeUnavailable},
		{"box", "wrong", connect.CodeUnauthenticated},
	} {
		c := processClient(t, srv.URL, tc.sandbox, tc.key)
		_, err := c.List(t.Context(), connect.NewRequest(&process.ListRequest{}))
		if connect.CodeOf(err) != tc.want {
			t.Errorf("sandbox %q key %q: %v, want %v", tc.sandbox, tc.key, err, tc.want)
		}
	}
}

// TestStartDeadlineBoundsTheCommand: an RPC deadline becomes the command's
// timeout, and the stream ends DeadlineExceeded (the SDKs' TimeoutError).
func TestStartDeadlineBoundsTheCommand(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	c := processClient(t, srv.URL, "box", keyA)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	st, err := c.Start(ctx, connect.NewRequest(startCmd("/bin/bash", "-c", "sleep 60")))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
	}
	var ce *connect.Error
	if !errors.As(st.Err(), &ce) || ce.Code() != connect.CodeDeadlineExceeded {
		t.Errorf("stream error = %v, want DeadlineExceeded", st.Err())
	}
	// The deadline reached the command itself: its timeout is the
	// remaining 300 ms, rounded up to the agent's 1 s unit.
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timeouts) != 1 || f.timeouts[0] != 1 {
		t.Errorf("the command's timeout_seconds %v, want [1]", f.timeouts)
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		cmd           string
		args          []string
		shell, script string
	}{
		{"/bin/bash", []string{"-l", "-c", "echo $HOME"}, "/bin/bash", "echo $HOME"},
		{"sh", []string{"-c", "ls"}, "sh", "ls"},
		{"/bin/bash", []string{"-i", "-l"}, "/bin/sh", "exec '/bin/bash' '-i' '-l'"},
		{"/usr/bin/python3", []string{"-c", "print('x')"}, "/bin/sh", `exec '/usr/bin/python3' '-c' 'print('\''x'\'')'`},
	} {
		shell, script := commandLine(tc.cmd, tc.args)
		if shell != tc.shell || script != tc.script {
			t.Errorf("commandLine(%q, %q) = %q, %q; want %q, %q", tc.cmd, tc.args, shell, script, tc.shell, tc.script)
		}
	}
}

func TestRequestUser(t *testing.T) {
	h := http.Header{}
	h.Set("Authorization", "Basic dXNlcjo=") // "user:"
	if u := requestUser(h); u != "user" {
		t.Errorf("requestUser = %q, want user", u)
	}
	if u := requestUser(http.Header{}); u != "" {
		t.Errorf("requestUser without a header = %q", u)
	}
}

// TestStreamInput: a client stream's start event names the process and
// its data events feed its stdin.
func TestStreamInput(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	c := processClient(t, srv.URL, "box", keyA)
	yes := true
	req := startCmd("/bin/sh", "-c", "cat")
	req.Stdin = &yes
	st, err := c.Start(t.Context(), connect.NewRequest(req))
	if err != nil || !st.Receive() {
		t.Fatalf("start: %v %v", err, st.Err())
	}
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: st.Msg().GetEvent().GetStart().GetPid()}}
	in := c.StreamInput(t.Context())
	for _, m := range []*process.StreamInputRequest{
		{Event: &process.StreamInputRequest_Start{Start: &process.StreamInputRequest_StartEvent{Process: sel}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("ab")}}}}},
		{Event: &process.StreamInputRequest_Data{Data: &process.StreamInputRequest_DataEvent{Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("cd")}}}}},
	} {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseStdin(t.Context(), connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
		t.Fatal(err)
	}
	e := collect(t, st.Receive, func() *process.ProcessEvent { return st.Msg().GetEvent() }, st.Err)
	if e.out.String() != "abcd" {
		t.Errorf("stdout = %q, want abcd", e.out.String())
	}
}

// TestMessageSizeBounded: an envd request message over maxRPCMessage is
// refused before it reaches a handler.
func TestMessageSizeBounded(t *testing.T) {
	f := newFakeCubicle(t)
	_, srv := f.door()
	c := processClient(t, srv.URL, "box", keyA)
	in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: make([]byte, maxRPCMessage+1)}}
	_, err := c.SendInput(t.Context(), connect.NewRequest(&process.SendInputRequest{Input: in}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("oversized SendInput: %v, want ResourceExhausted", err)
	}
}

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestExecEcho(t *testing.T) {
	c, _, _ := startAgent(t)
	out, errOut, code, err := run(t, c, protocol.ExecFrame{Command: "echo hi; echo oops >&2; exit 3", CloseStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if out != "hi\n" || errOut != "oops\n" || code != 3 {
		t.Fatalf("got %q %q %d", out, errOut, code)
	}
}

func TestExecSignalExitCode(t *testing.T) {
	c, _, _ := startAgent(t)
	_, _, code, err := run(t, c, protocol.ExecFrame{Command: "kill -TERM $$", CloseStdin: true})
	if err != nil || code != 128+15 {
		t.Fatalf("code %d err %v", code, err)
	}
}

func TestExecStartedFirst(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "echo $$", CommandID: "abc", CloseStdin: true})
	st := w.recv()
	if st.Type != protocol.FrameStarted || st.CommandID != "abc" || st.PID <= 0 {
		t.Fatalf("first frame %+v", st)
	}
	out, _, ex, frames := w.collect()
	if ex.Type != protocol.FrameExit || *ex.ExitCode != 0 {
		t.Fatalf("final %+v", ex)
	}
	if strings.TrimSpace(out) != strconv.Itoa(st.PID) {
		t.Fatalf("shell pid %q, started pid %d", out, st.PID)
	}
	if *frames[0].Offset != 0 {
		t.Fatalf("first offset %d", *frames[0].Offset)
	}
}

func TestExecEnvAndCwd(t *testing.T) {
	c, _, _ := startAgent(t, WithBaseEnv([]string{"BASE=1"}))
	dir := t.TempDir()
	out, _, _, err := run(t, c, protocol.ExecFrame{
		Command:    `echo "$BASE $FOO $(pwd) $PATH"`,
		CloseStdin: true,
		RunConfig:  &protocol.RunConfig{WorkDir: dir, EnvVars: map[string]string{"FOO": "bar"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "1 bar " + dir + " " + defaultPath + "\n"
	if out != want {
		t.Fatalf("got %q want %q", out, want)
	}
	out, _, _, err = run(t, c, protocol.ExecFrame{Command: "echo $FOO; pwd", Env: map[string]string{"FOO": "x"}, Cwd: dir, CloseStdin: true})
	if err != nil || out != "x\n"+dir+"\n" {
		t.Fatalf("deprecated env/cwd: %q %v", out, err)
	}
	_, _, _, err = run(t, c, protocol.ExecFrame{Command: "true", Cwd: dir, RunConfig: &protocol.RunConfig{}})
	var ee *ExecError
	if !errors.As(err, &ee) || ee.Type != protocol.ErrCommandError {
		t.Fatalf("run_config+cwd: %v", err)
	}
}

func TestExecShellFallback(t *testing.T) {
	c, _, _ := startAgent(t)
	out, _, _, err := run(t, c, protocol.ExecFrame{Command: "echo ok", Shell: "/nonexistent/shell", CloseStdin: true})
	if err != nil || out != "ok\n" {
		t.Fatalf("%q %v", out, err)
	}
}

func TestExecStdin(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "cat; echo done"})
	if f := w.recv(); f.Type != protocol.FrameStarted {
		t.Fatalf("%+v", f)
	}
	w.send(protocol.ExecFrame{Type: protocol.FrameInput, Data: "hello "})
	w.send(protocol.ExecFrame{Type: protocol.FrameInput, Data: "world\n"})
	w.send(protocol.ExecFrame{Type: protocol.FrameCloseStdin})
	out, _, ex, _ := w.collect()
	if out != "hello world\ndone\n" || *ex.ExitCode != 0 {
		t.Fatalf("%q %+v", out, ex)
	}
}

func TestExecCloseStdinTrue(t *testing.T) {
	c, _, _ := startAgent(t)
	start := time.Now()
	out, _, code, err := run(t, c, protocol.ExecFrame{Command: "cat; echo eof", CloseStdin: true})
	if err != nil || out != "eof\n" || code != 0 || time.Since(start) > 5*time.Second {
		t.Fatalf("%q %d %v", out, code, err)
	}
}

func TestExecKillProcessGroup(t *testing.T) {
	c, _, _ := startAgent(t)
	marker := filepath.Join(t.TempDir(), "child.pid")
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "sleep 100 & echo $! > " + marker + "; echo ready; wait", CloseStdin: true})
	w.recv() // started
	if f := w.recv(); f.Data != "ready\n" {
		t.Fatalf("%+v", f)
	}
	w.send(protocol.ExecFrame{Type: protocol.FrameKill})
	_, _, ex, _ := w.collect()
	if ex.Type != protocol.FrameExit || *ex.ExitCode == 0 {
		t.Fatalf("final %+v", ex)
	}
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	waitGone(t, pid)
}

// TestExecSIGKILLedCommandTakesItsGroup: a command whose shell dies of
// SIGKILL (here its own kill, as `kill -9 0` in a fork bomb) takes the rest
// of its process group with it before its exit is reported, so a bomb that
// gVisor's group kill left running cannot hold the task bound.
func TestExecSIGKILLedCommandTakesItsGroup(t *testing.T) {
	c, _, _ := startAgent(t)
	marker := filepath.Join(t.TempDir(), "child.pid")
	_, _, code, err := run(t, c, protocol.ExecFrame{Command: "sleep 100 & echo $! > " + marker + "; kill -9 $$"})
	if err != nil || code != 137 {
		t.Fatalf("exit %d, %v; want 137", code, err)
	}
	b, err := os.ReadFile(marker)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	if st, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
		t.Fatalf("process %s of the killed command's group is still running: %s", pid, st)
	}
}

// waitGone waits until pid is gone or a zombie (its parent, the killed
// shell, may not have been reaped by the test process).
func waitGone(t *testing.T, pid string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			return
		}
	}
	t.Fatalf("process %s survived the kill", pid)
}

func TestExecTimeout(t *testing.T) {
	c, _, _ := startAgent(t)
	start := time.Now()
	out, _, _, err := run(t, c, protocol.ExecFrame{Command: "echo before; sleep 30", TimeoutSeconds: i64(1), CloseStdin: true})
	if !errors.Is(err, ErrCommandTimeout) {
		t.Fatalf("err %v", err)
	}
	if out != "before\n" || time.Since(start) > 10*time.Second {
		t.Fatalf("out %q after %v", out, time.Since(start))
	}
}

// TestNoGoroutineLeak checks that finished commands and closed streams leave
// no goroutines behind (pumps, stdin writers, pingers, readers).
func TestNoGoroutineLeak(t *testing.T) {
	c, _, _ := startAgent(t)
	if err := c.Health(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	base := runtime.NumGoroutine()
	for _, f := range []protocol.ExecFrame{
		{Command: "echo hi", CloseStdin: true},
		{Command: "tty", PTY: true},
		{Command: "sleep 5", TimeoutSeconds: i64(1), CloseStdin: true},
		{Command: "(sleep 5 &); echo bg", CloseStdin: true}, // background child holds stdout
	} {
		run(t, c, f)
	}
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "cat"})
	w.recv()
	w.send(protocol.ExecFrame{Type: protocol.FrameCloseStdin})
	w.collect()
	w.c.CloseNow()
	var n int
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("goroutines: %d before, %d after\n%s", base, n, buf[:runtime.Stack(buf, true)])
}

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestUTF8Chunking(t *testing.T) {
	c, _, _ := startAgent(t)
	// "héllo €😀" written one byte at a time with pauses, so reads see
	// partial sequences.
	want := "héllo €😀"
	var cmd strings.Builder
	for _, b := range []byte(want) {
		cmd.WriteString(`printf '\` + octal(b) + `'; sleep 0.01; `)
	}
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: cmd.String(), CloseStdin: true})
	w.recv()
	out, _, ex, frames := w.collect()
	if out != want || *ex.ExitCode != 0 {
		t.Fatalf("got %q, %+v", out, ex)
	}
	var next int64
	for _, f := range frames {
		if !utf8.ValidString(f.Data) || *f.Offset != next {
			t.Fatalf("frame %+v, want offset %d", f, next)
		}
		next += int64(len(f.Data))
	}
	if len(frames) < 3 {
		t.Fatalf("expected several frames, got %d", len(frames))
	}
}

func octal(b byte) string {
	return string([]byte{'0' + b>>6, '0' + (b>>3)&7, '0' + b&7})
}

func TestReconnectFromOffset(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, CommandID: "rc1", Command: "printf 'héllo '; printf 'err' >&2; sleep 0.3; printf world", CloseStdin: true})
	w.recv()
	// Read the first chunk and drop the connection mid-command.
	f := w.recv()
	for f.Type != protocol.FrameStdout {
		f = w.recv()
	}
	if f.Data != "héllo " {
		t.Fatalf("first chunk %+v", f)
	}
	w.c.CloseNow()

	w2 := dial(t, c)
	w2.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "rc1", StdoutOffset: 7, StderrOffset: 1})
	if st := w2.recv(); st.Type != protocol.FrameStarted || st.CommandID != "rc1" {
		t.Fatalf("ack %+v", st)
	}
	out, errOut, ex, frames := w2.collect()
	if out != "world" || errOut != "rr" || *ex.ExitCode != 0 {
		t.Fatalf("remainder %q %q %+v", out, errOut, ex)
	}
	for _, f := range frames {
		if f.Type == protocol.FrameStdout && *f.Offset != 7 {
			t.Fatalf("stdout offset %d", *f.Offset)
		}
	}
	// After exit, a reconnect within the TTL replays and exits again.
	w3 := dial(t, c)
	w3.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "rc1", StdoutOffset: 0})
	w3.recv()
	out, _, ex, _ = w3.collect()
	if out != "héllo world" || *ex.ExitCode != 0 {
		t.Fatalf("replay %q %+v", out, ex)
	}
}

func TestSameCommandIDRunsOnce(t *testing.T) {
	c, _, _ := startAgent(t)
	f := filepath.Join(t.TempDir(), "count")
	req := protocol.ExecFrame{CommandID: "once", Command: "echo x >> " + f + "; sleep 0.2; echo done", CloseStdin: true}
	done := make(chan string, 2)
	for range 2 {
		go func() {
			out, _, _, err := run(t, c, req)
			if err != nil {
				out = err.Error()
			}
			done <- out
		}()
	}
	for range 2 {
		if out := <-done; out != "done\n" {
			t.Fatalf("output %q", out)
		}
	}
	out, _, _, _ := run(t, c, req) // finished: attach replays, no re-run
	b, _ := os.ReadFile(f)
	if string(b) != "x\n" || out != "done\n" {
		t.Fatalf("ran %q times, replay %q", b, out)
	}
}

func TestReconnectUnknownAndExpired(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "nope"})
	if f := w.recv(); f.Type != protocol.FrameError || f.ErrorType != protocol.ErrCommandNotFound {
		t.Fatalf("%+v", f)
	}
	if _, _, _, err := run(t, c, protocol.ExecFrame{CommandID: "short", Command: "echo hi", TTLSeconds: i64(1), CloseStdin: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	w = dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "short"})
	if f := w.recv(); f.Type != protocol.FrameError || f.ErrorType != protocol.ErrSessionExpired {
		t.Fatalf("%+v", f)
	}
}

func TestKillOnDisconnect(t *testing.T) {
	c, _, _ := startAgent(t)
	marker := filepath.Join(t.TempDir(), "pid")
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, CommandID: "kod", KillOnDisconnect: true, Command: "echo $$ > " + marker + "; echo go; sleep 100", CloseStdin: true})
	w.recv()
	w.recv() // "go"
	w.c.CloseNow()
	b, _ := os.ReadFile(marker)
	waitGone(t, strings.TrimSpace(string(b)))
}

func TestIdleTimeout(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, CommandID: "idle", IdleTimeoutSeconds: i64(1), Command: "echo go; sleep 100", CloseStdin: true})
	st := w.recv()
	w.recv()
	w.c.CloseNow()
	time.Sleep(200 * time.Millisecond)
	w = dial(t, c) // re-attaching cancels the idle kill...
	w.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "idle", StdoutOffset: 3})
	w.recv()
	w.c.CloseNow() // ...and leaving re-arms it
	waitGone(t, strconv.Itoa(st.PID))
}

func TestMultipleClients(t *testing.T) {
	c, _, _ := startAgent(t)
	a := dial(t, c)
	a.send(protocol.ExecFrame{Type: protocol.FrameExecute, CommandID: "multi", Command: "echo one; sleep 0.3; echo two", CloseStdin: true})
	a.recv()
	b := dial(t, c)
	b.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "multi"})
	b.recv()
	for _, w := range []*wsConn{a, b} {
		out, _, ex, _ := w.collect()
		if out != "one\ntwo\n" || *ex.ExitCode != 0 {
			t.Fatalf("%q %+v", out, ex)
		}
	}
}

func TestPTY(t *testing.T) {
	c, _, _ := startAgent(t, WithBaseEnv(nil))
	out, _, code, err := run(t, c, protocol.ExecFrame{Command: "tty; stty size; echo $TERM", PTY: true})
	if err != nil || code != 0 {
		t.Fatal(code, err)
	}
	lines := strings.Split(strings.ReplaceAll(out, "\r", ""), "\n")
	if !strings.HasPrefix(lines[0], "/dev/pts/") || lines[1] != "24 80" || lines[2] != "xterm-256color" {
		t.Fatalf("%q", out)
	}
	out, _, _, _ = run(t, c, protocol.ExecFrame{Command: "stty size", PTY: true, Rows: 50, Cols: 132})
	if strings.TrimSpace(out) != "50 132" {
		t.Fatalf("sized %q", out)
	}

	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, PTY: true, Command: "read line; stty size; echo got=$line"})
	w.recv()
	w.send(protocol.ExecFrame{Type: protocol.FrameResize, Rows: 40, Cols: 100})
	time.Sleep(50 * time.Millisecond)
	w.send(protocol.ExecFrame{Type: protocol.FrameInput, Data: "abc\n"})
	out, _, ex, _ := w.collect()
	if !strings.Contains(out, "40 100") || !strings.Contains(out, "got=abc") || *ex.ExitCode != 0 {
		t.Fatalf("interactive %q %+v", out, ex)
	}
}

func TestRunAsUser(t *testing.T) {
	testenv.RequireRoot(t, "to run commands as other users")
	c, srv, _ := startAgent(t, WithBaseEnv(nil))
	// The sandbox's own passwd and group files, not the host's.
	srv.root = t.TempDir()
	os.MkdirAll(filepath.Join(srv.root, "etc"), 0o755)
	os.WriteFile(filepath.Join(srv.root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(srv.root, "etc/group"), []byte("root:x:0:\nstaff:x:50:alice,bob\nalice:x:1000:\nwheel:x:10:root\n"), 0o644)
	for spec, want := range map[string]string{
		"1000":        "1000 1000 1000 50 /home/alice alice",
		"alice":       "1000 1000 1000 50 /home/alice alice",
		"alice:staff": "1000 50 50 /home/alice alice",
		"1234:1234":   "1234 1234 1234 / ",
		"0":           "0 0 0 10 /root root",
	} {
		out, errOut, _, err := run(t, c, protocol.ExecFrame{Command: "echo $(id -u) $(id -g) $(id -G) $HOME $USER", RunConfig: &protocol.RunConfig{User: spec}, CloseStdin: true})
		if err != nil || strings.TrimSpace(out) != strings.TrimSpace(want) {
			t.Errorf("user %s: %q %q %v, want %q", spec, out, errOut, err, want)
		}
	}
	_, _, _, err := run(t, c, protocol.ExecFrame{Command: "true", RunConfig: &protocol.RunConfig{User: "no-such-user"}})
	if err == nil {
		t.Fatal("unknown user accepted")
	}
}

func TestPTYEndOfInput(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, PTY: true, Command: "cat >/dev/null; echo eof"})
	w.recv()
	w.send(protocol.ExecFrame{Type: protocol.FrameInput, Data: "line\n\x04"})
	out, _, ex, _ := w.collect()
	if !strings.Contains(out, "eof") || *ex.ExitCode != 0 {
		t.Fatalf("%q %+v", out, ex)
	}
}

func TestExecuteExpiredID(t *testing.T) {
	c, _, _ := startAgent(t)
	req := protocol.ExecFrame{CommandID: "gone", Command: "echo hi", TTLSeconds: i64(0), CloseStdin: true}
	if _, _, _, err := run(t, c, req); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	_, _, _, err := run(t, c, req)
	var ee *ExecError
	if !errors.As(err, &ee) || ee.Type != protocol.ErrSessionExpired {
		t.Fatalf("re-execute of an expired id: %v", err)
	}
}

// TestPumpTakesBufferedOutputAfterDeadline: output a command wrote before
// it exited is delivered even when its pump had not read it by the time
// drain gave up waiting for EOF (a background child holds the pipe open).
// Closing the pipe instead lost it on a loaded host.
func TestPumpTakesBufferedOutputAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// w is the "background child": the pipe never reaches EOF. want is
	// more than one read.
	defer w.Close()
	want := strings.Repeat("x", 100<<10) + "tail\n"
	go w.Write([]byte(want))
	s := newSession("t", 1<<20)
	// The pump runs only after drain set the deadline, with the writer
	// still holding the pipe: it must take what is buffered and stop.
	time.Sleep(50 * time.Millisecond)
	if err := r.SetReadDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { s.pump(streamStdout, r); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("pump did not stop after the deadline")
	}
	got := string(s.out[streamStdout].buf)
	if len(got) < 64<<10 || !strings.HasPrefix(want, got) {
		t.Fatalf("pump kept %d bytes, want the %d the pipe held (a prefix of what was written)", len(got), 64<<10)
	}
}

package cubicle

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// streamLog records writes to stdout and stderr in one ordered log.
type streamLog struct {
	mu      sync.Mutex
	entries []string
}

func (l *streamLog) writer(prefix string) writerFunc {
	return func(p []byte) (int, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.entries = append(l.entries, prefix+string(p))
		return len(p), nil
	}
}

func (l *streamLog) joined(prefix string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, e := range l.entries {
		if s, ok := strings.CutPrefix(e, prefix); ok {
			b.WriteString(s)
		}
	}
	return b.String()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestExecStreamsInOrderWithExitCode(t *testing.T) {
	d := newFakeDaemon(t)
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		f := readFrame(t, ctx, conn)
		if f.Type != protocol.FrameExecute || f.Command != "make" || !f.CloseStdin || f.CommandID == "" {
			t.Errorf("first frame = %+v, want execute of make with close_stdin and a command id", f)
		}
		if f.TimeoutSeconds == nil || *f.TimeoutSeconds != 2 {
			t.Errorf("timeout_seconds = %v, want 2 (1.5 s rounded up)", f.TimeoutSeconds)
		}
		sendFrames(t, ctx, conn,
			started(f.CommandID),
			out("stdout", "a", 0),
			out("stderr", "b", 0),
			protocol.ExecFrame{Type: "heartbeat"},
			out("stdout", "c", 1),
			exit(3))
		conn.Close(websocket.StatusNormalClosure, "")
	})
	var log streamLog
	code, err := d.client().Exec(t.Context(), "box", ExecRequest{
		Command: "make", Timeout: 1500 * time.Millisecond,
		Stdout: log.writer("out:"), Stderr: log.writer("err:"),
	})
	if err != nil || code != 3 {
		t.Fatalf("Exec = %d, %v; want 3, nil", code, err)
	}
	want := []string{"out:a", "err:b", "out:c"}
	if strings.Join(log.entries, ",") != strings.Join(want, ",") {
		t.Fatalf("output order = %q, want %q", log.entries, want)
	}
}

// A socket dropped mid-stream is resumed with the delivered offsets, and a
// server replaying from earlier offsets causes no duplicate output.
func TestExecReconnectResumesWithoutDuplicates(t *testing.T) {
	d := newFakeDaemon(t)
	var id string
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		f := readFrame(t, ctx, conn)
		switch attempt {
		case 0:
			id = f.CommandID
			sendFrames(t, ctx, conn, started(id), out("stdout", "hello ", 0), out("stderr", "warn", 0))
			// Return without a close frame: an abrupt drop.
		case 1:
			want := protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: id, StdoutOffset: 6, StderrOffset: 4}
			if f.Type != want.Type || f.CommandID != want.CommandID || f.StdoutOffset != want.StdoutOffset || f.StderrOffset != want.StderrOffset {
				t.Errorf("reconnect frame = %+v, want %+v", f, want)
			}
			// Replay overlapping the delivered bytes, as a ring buffer may.
			sendFrames(t, ctx, conn, started(id),
				out("stdout", "lo world", 3), out("stderr", "warn", 0), out("stderr", "!", 4), exit(0))
			conn.Close(websocket.StatusNormalClosure, "")
		default:
			t.Errorf("unexpected attempt %d", attempt)
		}
	})
	var log streamLog
	code, err := d.client().Exec(t.Context(), "box", ExecRequest{
		Command: "greet", Stdout: log.writer("out:"), Stderr: log.writer("err:"),
	})
	if err != nil || code != 0 {
		t.Fatalf("Exec = %d, %v; want 0, nil", code, err)
	}
	if got := log.joined("out:"); got != "hello world" {
		t.Errorf("stdout = %q, want %q", got, "hello world")
	}
	if got := log.joined("err:"); got != "warn!" {
		t.Errorf("stderr = %q, want %q", got, "warn!")
	}
}

func TestExecForwardsStdinThenCloses(t *testing.T) {
	d := newFakeDaemon(t)
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		f := readFrame(t, ctx, conn)
		if f.CloseStdin {
			t.Errorf("execute has close_stdin with Stdin given")
		}
		sendFrames(t, ctx, conn, started(f.CommandID))
		var in strings.Builder
		for {
			f := readFrame(t, ctx, conn)
			if f.Type == protocol.FrameCloseStdin || f.Type == "" {
				break
			}
			if f.Type != protocol.FrameInput {
				t.Errorf("frame %q before close_stdin", f.Type)
			}
			in.WriteString(f.Data)
		}
		sendFrames(t, ctx, conn, out("stdout", in.String(), 0), exit(0))
		conn.Close(websocket.StatusNormalClosure, "")
	})
	var log streamLog
	input := strings.Repeat("héllo wörld\n", 10000) // >32 KiB: several frames, multi-byte runes
	code, err := d.client().Exec(t.Context(), "box", ExecRequest{
		Command: "cat", Stdin: strings.NewReader(input), Stdout: log.writer("out:"),
	})
	if err != nil || code != 0 {
		t.Fatalf("Exec = %d, %v", code, err)
	}
	if got := log.joined("out:"); got != input {
		t.Errorf("echoed %d bytes, want the %d sent", len(got), len(input))
	}
}

func TestExecTimeoutIsErrCommandTimeout(t *testing.T) {
	d := newFakeDaemon(t)
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		f := readFrame(t, ctx, conn)
		sendFrames(t, ctx, conn, started(f.CommandID),
			protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrCommandTimeout, Error: "ran 1s"})
		conn.Close(websocket.StatusNormalClosure, "")
	})
	_, err := d.client().Exec(t.Context(), "box", ExecRequest{Command: "sleep 9"})
	if !errors.Is(err, ErrCommandTimeout) {
		t.Fatalf("err = %v, want ErrCommandTimeout", err)
	}
}

func TestExecCancelSendsKill(t *testing.T) {
	d := newFakeDaemon(t)
	killed := make(chan bool, 1)
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		if attempt > 0 {
			t.Errorf("reconnected after cancel")
			return
		}
		f := readFrame(t, ctx, conn)
		sendFrames(t, ctx, conn, started(f.CommandID), out("stdout", "x", 0))
		killed <- readFrame(t, ctx, conn).Type == protocol.FrameKill
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	_, err := d.client().Exec(ctx, "box", ExecRequest{
		Command: "sleep 9",
		Stdout:  writerFunc(func(p []byte) (int, error) { cancel(); return len(p), nil }),
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if !<-killed {
		t.Fatal("server did not get a kill frame")
	}
}

func TestUTF8Boundary(t *testing.T) {
	e := []byte("é")  // 2 bytes
	eu := []byte("€") // 3 bytes
	for _, tc := range []struct {
		in   []byte
		want int
	}{
		{[]byte("abc"), 3},
		{append([]byte("a"), e[0]), 1},
		{append([]byte("a"), e...), 3},
		{append([]byte("a"), eu[:2]...), 1},
		{append([]byte("a"), eu...), 4},
		{[]byte{0x80, 0x80, 0x80, 0x80}, 4}, // invalid: pass through
	} {
		if got := utf8Boundary(tc.in); got != tc.want {
			t.Errorf("utf8Boundary(%x) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

// TestExecBinaryNegotiated: Exec asks for base64 on execute and reconnect;
// once the server agrees, input and output are exact bytes (servers that
// do not agree get text frames: the other tests).
func TestExecBinaryNegotiated(t *testing.T) {
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	input := bytes.Repeat(all, 1000) // several input frames
	b64 := base64.StdEncoding.EncodeToString
	d := newFakeDaemon(t)
	d.handleExec(func(ctx context.Context, conn *websocket.Conn, attempt int) {
		conn.SetReadLimit(1 << 20) // as Cubicle's daemon: binary input frames exceed the library's 32 KiB
		f := readFrame(t, ctx, conn)
		if f.Encoding != protocol.EncodingBase64 {
			t.Errorf("attempt %d: %s frame without encoding base64", attempt, f.Type)
		}
		st := started(f.CommandID)
		st.Encoding = protocol.EncodingBase64
		sendFrames(t, ctx, conn, st)
		if attempt > 0 {
			if f.Type != protocol.FrameReconnect || f.StdoutOffset != 0xc3 {
				t.Errorf("attempt %d: %s at offset %d, want reconnect at 0xc3", attempt, f.Type, f.StdoutOffset)
			}
			sendFrames(t, ctx, conn, out("stdout", b64(input[f.StdoutOffset:]), f.StdoutOffset), exit(0))
			conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		var in []byte
		for {
			f := readFrame(t, ctx, conn)
			if f.Type != protocol.FrameInput {
				break
			}
			b, err := base64.StdEncoding.DecodeString(f.Data)
			if err != nil {
				t.Errorf("input frame: %v", err)
			}
			in = append(in, b...)
		}
		if !bytes.Equal(in, input) {
			t.Errorf("server got %d input bytes, want the %d sent", len(in), len(input))
		}
		sendFrames(t, ctx, conn, out("stdout", b64(input[:0xc3]), 0)) // then drop: a reconnect resumes at 0xc3
		conn.CloseNow()
	})
	var got bytes.Buffer
	code, err := d.client().Exec(t.Context(), "box", ExecRequest{Command: "cat", Stdin: bytes.NewReader(input), Stdout: &got})
	if err != nil || code != 0 {
		t.Fatalf("Exec = %d, %v", code, err)
	}
	if !bytes.Equal(got.Bytes(), input) {
		t.Errorf("got %d output bytes, want the exact %d", got.Len(), len(input))
	}
}

package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// allBytes is every byte value once, in order.
func allBytes() []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// printfAll is a shell command printing every byte value once.
func printfAll() string {
	var cmd strings.Builder
	cmd.WriteString("printf '")
	for _, b := range allBytes() {
		cmd.WriteString(`\` + octal(b))
	}
	cmd.WriteString("'")
	return cmd.String()
}

// collectBinary reads a binary connection's frames until exit or error,
// returning decoded stdout and stderr and the final frame. Output offsets
// must be contiguous byte offsets from start.
func (w *wsConn) collectBinary(start int64) ([]byte, []byte, protocol.ExecFrame) {
	w.t.Helper()
	var out [2]bytes.Buffer
	base := [2]int64{start, 0}
	for {
		f := w.recv()
		i := streamStdout
		switch f.Type {
		case protocol.FrameStderr:
			i = streamStderr
		case protocol.FrameStdout:
		case protocol.FrameExit, protocol.FrameError:
			return out[0].Bytes(), out[1].Bytes(), f
		default:
			continue
		}
		data, err := base64.StdEncoding.DecodeString(f.Data)
		if err != nil {
			w.t.Fatalf("%s frame is not base64: %v", f.Type, err)
		}
		if want := base[i] + int64(out[i].Len()); *f.Offset != want {
			w.t.Fatalf("%s frame at offset %d, want %d", f.Type, *f.Offset, want)
		}
		out[i].Write(data)
	}
}

func TestBinarySessionRoundTripsEveryByte(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "cat; cat >&2 </dev/null; " + printfAll() + " >&2",
		Encoding: protocol.EncodingBase64})
	if st := w.recv(); st.Type != protocol.FrameStarted || st.Encoding != protocol.EncodingBase64 {
		t.Fatalf("started %+v, want encoding base64", st)
	}
	in := allBytes()
	// Split inside what would be multi-byte sequences, twice over.
	for _, part := range [][]byte{in[:0xc3], in[0xc3:0xe1], in[0xe1:], in} {
		w.send(protocol.ExecFrame{Type: protocol.FrameInput, Data: base64.StdEncoding.EncodeToString(part)})
	}
	w.send(protocol.ExecFrame{Type: protocol.FrameCloseStdin})
	out, errOut, ex := w.collectBinary(0)
	if want := append(allBytes(), allBytes()...); !bytes.Equal(out, want) {
		t.Errorf("stdout: got %d bytes %x, want every byte value twice", len(out), out)
	}
	if !bytes.Equal(errOut, allBytes()) {
		t.Errorf("stderr: got %d bytes %x, want every byte value", len(errOut), errOut)
	}
	if ex.Type != protocol.FrameExit || *ex.ExitCode != 0 {
		t.Fatalf("end %+v", ex)
	}
}

// A binary session holds back no bytes: a lone UTF-8 lead byte reaches the
// client while the command still runs, where a text session waits for the
// rest of its sequence.
func TestBinarySessionDoesNotHoldPartialSequences(t *testing.T) {
	c, _, _ := startAgent(t)
	for _, tc := range []struct {
		encoding string
		early    bool
	}{{protocol.EncodingBase64, true}, {"", false}} {
		w := dial(t, c)
		w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: `printf '\342'; read x`, Encoding: tc.encoding})
		w.recv()                       // started
		wait := 500 * time.Millisecond // a text session must hold the byte at least this long
		if tc.early {
			wait = 10 * time.Second // the command sleeps forever: any frame came early
		}
		ctx, cancel := context.WithTimeout(ctxT(t), wait)
		f, err := readFrame(ctx, w.c)
		cancel()
		if got := err == nil; got != tc.early {
			t.Fatalf("encoding %q: output before exit = %v (%+v, %v), want %v", tc.encoding, got, f, err, tc.early)
		}
		if tc.early && (f.Type != protocol.FrameStdout || f.Data != base64.StdEncoding.EncodeToString([]byte{0xe2})) {
			t.Fatalf("first frame %+v, want the byte e2", f)
		}
	}
}

// Text sessions keep the protocol's text frames: invalid bytes arrive as
// U+FFFD and started carries no encoding.
func TestTextSessionUnchanged(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: `printf 'a\377b'`, CloseStdin: true})
	if st := w.recv(); st.Type != protocol.FrameStarted || st.Encoding != "" {
		t.Fatalf("started %+v, want no encoding", st)
	}
	if out, _, ex, _ := w.collect(); out != "a\ufffdb" || *ex.ExitCode != 0 {
		t.Fatalf("got %q %+v", out, ex)
	}
}

// A binary reconnect resumes at any byte offset, even inside a character,
// and may attach to a session a text client started.
func TestBinaryReconnectMidSequence(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, CommandID: "bin-rc", Command: "printf 'héllo'", CloseStdin: true})
	w.collect()
	w2 := dial(t, c)
	w2.send(protocol.ExecFrame{Type: protocol.FrameReconnect, CommandID: "bin-rc", StdoutOffset: 2, Encoding: protocol.EncodingBase64})
	if st := w2.recv(); st.Encoding != protocol.EncodingBase64 {
		t.Fatalf("started %+v", st)
	}
	if out, _, ex := w2.collectBinary(2); string(out) != "\xa9llo" || *ex.ExitCode != 0 {
		t.Fatalf("got %q %+v", out, ex)
	}
}

func TestUnknownEncodingRefused(t *testing.T) {
	c, _, _ := startAgent(t)
	w := dial(t, c)
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "true", Encoding: "utf-16"})
	if f := w.recv(); f.Type != protocol.FrameError || f.ErrorType != protocol.ErrCommandError || !strings.Contains(f.Error, "utf-16") {
		t.Fatalf("got %+v, want an error naming the encoding", f)
	}
}

// The daemon's client gets the exact bytes when it asks for base64 (and
// text, as POST /execute answers, when it does not).
func TestClientExecIsBinarySafe(t *testing.T) {
	c, _, _ := startAgent(t)
	out, _, code, err := run(t, c, protocol.ExecFrame{Command: printfAll(), Encoding: protocol.EncodingBase64})
	if err != nil || code != 0 || out != string(allBytes()) {
		t.Fatalf("got %x (%d bytes), code %d, %v", out, len(out), code, err)
	}
}

package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestExecTap feeds a relayed stream's frames through the tap: output
// replayed after a reconnect counts once, a client's kill and the exit
// are events of the step, and input frames are not decoded as commands.
func TestExecTap(t *testing.T) {
	_, rec := newRecordAPI(t)
	ctx := context.Background()
	frame := func(f protocol.ExecFrame) []byte { b, _ := json.Marshal(f); return b }
	off := func(n int64) *int64 { return &n }
	tap := &execTap{ctx: ctx, cmd: rec.StartCommand(ctx, record.CommandStart{SandboxID: "s", CommandID: "c", Command: "yes"})}
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameStarted, CommandID: "c"}))
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameStdout, Data: "abc", Offset: off(0)}))
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameStdout, Data: "bcd", Offset: off(1)})) // replay after reconnect
	tap.fromAgent([]byte(`{"offset":4,"data":"\n","type":"stdout"}`))                                 // another shape: decoded in full
	tap.fromClient(frame(protocol.ExecFrame{Type: protocol.FrameInput, Data: `"kill"`}))
	tap.fromClient(frame(protocol.ExecFrame{Type: protocol.FrameKill}))
	code := 137
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &code}))
	var nilTap *execTap
	nilTap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameExit})) // no recorder: a no-op
	st, err := rec.Step(ctx, "s", tap.cmd.Step())
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, e := range st.Events {
		types = append(types, e.Type)
	}
	if strings.Join(types, " ") != "command.started command.killed command.exited" || st.Stdout == nil || st.Stdout.Head != "abcd\n" {
		t.Fatalf("types %v stdout %+v", types, st.Stdout)
	}
	if d := string(st.Events[2].Data); !strings.Contains(d, `"exit_code":137`) || !strings.Contains(d, `"stdout_bytes":5`) {
		t.Fatalf("exited %s", d)
	}

	timedOut := &execTap{ctx: ctx, cmd: rec.StartCommand(ctx, record.CommandStart{SandboxID: "s", CommandID: "t", Command: "sleep 9"})}
	timedOut.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrCommandTimeout}))
	st, _ = rec.Step(ctx, "s", timedOut.cmd.Step())
	if len(st.Events) != 3 || !strings.Contains(string(st.Events[1].Data), record.KillTimeout) || !strings.Contains(string(st.Events[2].Data), `"exit_code":null`) {
		t.Fatalf("timeout step %+v", st.Events)
	}

	expired := &execTap{ctx: ctx, cmd: rec.StartCommand(ctx, record.CommandStart{SandboxID: "s", CommandID: "e", Command: "sleep 9"})}
	expired.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameError, ErrorType: protocol.ErrSessionExpired}))
	st, _ = rec.Step(ctx, "s", expired.cmd.Step())
	if len(st.Events) != 2 || !strings.Contains(string(st.Events[1].Data), `"lost":"SessionExpired"`) || rec.OpenCommand("s", "e") != nil {
		t.Fatalf("expired step %+v", st.Events)
	}
}

// TestExecTapBinary: on a connection the agent made binary-safe, output
// data is base64 and the record keeps the exact bytes, whichever path
// (undecoded split or full decode) a frame takes.
func TestExecTapBinary(t *testing.T) {
	_, rec := newRecordAPI(t)
	ctx := context.Background()
	frame := func(f protocol.ExecFrame) []byte { b, _ := json.Marshal(f); return b }
	off := func(n int64) *int64 { return &n }
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	b64 := base64.StdEncoding.EncodeToString
	tap := &execTap{ctx: ctx, cmd: rec.StartCommand(ctx, record.CommandStart{SandboxID: "s", CommandID: "b", Command: "cat"})}
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameStarted, CommandID: "b", Encoding: protocol.EncodingBase64}))
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameStdout, Data: b64(all[:200]), Offset: off(0)}))
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameStdout, Data: b64(all[100:]), Offset: off(100)})) // replay
	tap.fromAgent([]byte(`{"offset":0,"data":"` + b64(all[250:]) + `","type":"stderr"}`))                        // decoded in full
	code := 0
	tap.fromAgent(frame(protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &code}))
	st, err := rec.Step(ctx, "s", tap.cmd.Step())
	if err != nil {
		t.Fatal(err)
	}
	if st.Stdout == nil || st.Stdout.Head != string(all) || st.Stderr == nil || st.Stderr.Head != string(all[250:]) {
		t.Fatalf("stdout %+v stderr %+v, want the exact bytes", st.Stdout, st.Stderr)
	}
}

// TestOutputFrame checks the relay's undecoded split of output frames:
// the agent's shape is split, anything else is left to a full decode.
func TestOutputFrame(t *testing.T) {
	for _, c := range []struct {
		in, stream, lit string
		off             int64
		ok              bool
	}{
		{`{"type":"stdout","data":"a\"b,\"offset\":9","offset":12}`, "stdout", `"a\"b,\"offset\":9"`, 12, true},
		{`{"type":"stderr","data":"x","offset":0}`, "stderr", `"x"`, 0, true},
		{`{"type":"stdout","offset":3}`, "", "", 0, false},
		{`{"type":"stdout","data":"x","offset":-1}`, "", "", 0, false},
		{`{"type":"exit","exit_code":0}`, "", "", 0, false},
		{`{"type":"stdout","data":x","offset":1}`, "", "", 0, false},
	} {
		stream, lit, off, ok := outputFrame([]byte(c.in))
		if ok != c.ok || stream != c.stream || string(lit) != c.lit || off != c.off {
			t.Errorf("%s: %q %q %d %v", c.in, stream, lit, off, ok)
		}
	}
}

// BenchmarkTapOutput is the record's cost per relayed 32 KiB output frame.
func BenchmarkTapOutput(b *testing.B) {
	_, rec := newRecordAPI(b)
	ctx := context.Background()
	tap := &execTap{ctx: ctx, cmd: rec.StartCommand(ctx, record.CommandStart{SandboxID: "s", CommandID: "c", Command: "cat"})}
	data := strings.Repeat("0123456789abcde\n", 2048)
	lit, _ := json.Marshal(data)
	b.SetBytes(int64(len(data)))
	var off int64
	for b.Loop() {
		// A fresh frame each time, as the relay reads them (the copy is
		// in the figure: an upper bound).
		f := append(append(append([]byte(nil), stdoutFramePrefix...), lit...), offsetKey...)
		f = append(strconv.AppendInt(f, off, 10), '}')
		tap.fromAgent(f)
		off += int64(len(data))
	}
}

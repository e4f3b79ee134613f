package agent

import (
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestSlowClientGetsEveryByte: a command writing far more than the output
// window to an attached client that reads slowly must deliver every byte,
// in order, with contiguous offsets — the window applies backpressure to
// the command instead of dropping output a live client has not taken.
func TestSlowClientGetsEveryByte(t *testing.T) {
	c, _, _ := startAgent(t, WithOutputBuffer(64<<10))
	w := dial(t, c)
	const total = 1 << 20 // 16 windows
	w.send(protocol.ExecFrame{Type: protocol.FrameExecute, Command: "head -c 1048576 /dev/zero | tr '\\0' x", Shell: "/bin/sh",
		CommandID: "bp-1", CloseStdin: true})
	if f := w.recv(); f.Type != protocol.FrameStarted {
		t.Fatalf("first frame %+v", f)
	}
	var got strings.Builder
	var next int64
	for {
		f := w.recv()
		if f.Type == protocol.FrameExit {
			if *f.ExitCode != 0 {
				t.Fatalf("exit %d", *f.ExitCode)
			}
			break
		}
		if f.Type != protocol.FrameStdout {
			t.Fatalf("unexpected frame %+v", f)
		}
		if *f.Offset != next {
			t.Fatalf("offset %d, want %d: output was dropped", *f.Offset, next)
		}
		next += int64(len(f.Data))
		got.WriteString(f.Data)
		time.Sleep(time.Millisecond) // a slow reader
	}
	if got.Len() != total || strings.Trim(got.String(), "x") != "" {
		t.Fatalf("received %d bytes, want %d", got.Len(), total)
	}
}

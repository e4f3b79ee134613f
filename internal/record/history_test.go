package record

import (
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestDiverge(t *testing.T) {
	zero, one := 0, 1
	step := func(sb string, n int64, cmd string, code *int) protocol.HistoryStep {
		return protocol.HistoryStep{SandboxID: sb, Step: n, Command: cmd, Shell: "/bin/sh", ExitCode: code}
	}
	shared := step("p", 3, "make", &zero)
	for _, c := range []struct {
		name string
		a, b []protocol.HistoryStep
		want int
	}{
		{"same ancestor step", []protocol.HistoryStep{shared, step("a", 9, "x", &zero)}, []protocol.HistoryStep{shared, step("b", 9, "y", &zero)}, 1},
		{"same command and outcome elsewhere", []protocol.HistoryStep{step("a", 1, "ls", &zero)}, []protocol.HistoryStep{step("b", 5, "ls", &zero)}, 1},
		{"same command, other exit", []protocol.HistoryStep{step("a", 1, "ls", &zero)}, []protocol.HistoryStep{step("b", 1, "ls", &one)}, 0},
		{"exit vs none", []protocol.HistoryStep{step("a", 1, "ls", &zero)}, []protocol.HistoryStep{step("b", 1, "ls", nil)}, 0},
		{"one is a prefix", []protocol.HistoryStep{shared}, []protocol.HistoryStep{shared, step("b", 4, "y", nil)}, 1},
		{"nothing", nil, []protocol.HistoryStep{shared}, 0},
	} {
		if got := Diverge(c.a, c.b); got != c.want {
			t.Errorf("%s: Diverge = %d, want %d", c.name, got, c.want)
		}
	}
}

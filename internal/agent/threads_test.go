package agent

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func threadCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads line in /proc/self/status")
	return 0
}

// TestReserveThreadsKeepsThem: the reserved threads exist after the call
// returns (parked idle, not destroyed), so the agent needs no new thread
// when a command exhausts the sandbox's task limit. Asking for more than
// the process has means the threads cannot all be ones it had.
func TestReserveThreadsKeepsThem(t *testing.T) {
	n := threadCount(t) + 16
	reserveThreads(n)
	if after := threadCount(t); after < n {
		t.Fatalf("%d threads after reserving %d: not kept", after, n)
	}
}

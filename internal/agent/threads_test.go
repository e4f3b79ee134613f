package agent

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
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

// TestForksWaitForReservedThreads: the agent serves before its threads
// are reserved, so a command that arrives early must wait for them (a
// fork bomb could otherwise take the tasks the agent's threads need).
func TestForksWaitForReservedThreads(t *testing.T) {
	r := newReaper(false)
	gate := make(chan struct{})
	r.threads = gate
	forked := make(chan struct{})
	go r.start(func() (int, error) { close(forked); return 0, errors.New("no fork in this test") })
	select {
	case <-forked:
		t.Fatal("forked before the threads were reserved")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	select {
	case <-forked:
	case <-time.After(5 * time.Second):
		t.Fatal("did not fork once the threads were reserved")
	}
}

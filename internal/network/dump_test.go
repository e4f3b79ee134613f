package network

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestConsistentDump: an interrupted dump is retried until one is
// consistent; other errors return at once; endless interruptions end
// with an error, never partial results taken as whole.
func TestConsistentDump(t *testing.T) {
	calls := 0
	got, err := consistentDump(func() (int, error) {
		calls++
		if calls < 3 {
			return -1, netlink.ErrDumpInterrupted
		}
		return 42, nil
	})
	if got != 42 || err != nil || calls != 3 {
		t.Fatalf("got %d, %v after %d calls; want 42 after 3", got, err, calls)
	}
	boom := errors.New("boom")
	calls = 0
	if _, err := consistentDump(func() (int, error) { calls++; return 0, boom }); !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("a plain error: %v after %d calls", err, calls)
	}
	if _, err := consistentDump(func() (int, error) { return 0, netlink.ErrDumpInterrupted }); !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatalf("endless interruptions: %v", err)
	}
}

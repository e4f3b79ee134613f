package cli

import (
	"bytes"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestBuildProgressLines: off a terminal, a built-in's build prints one
// line per tenth of the way, not one per poll; listings mark built-ins
// and show a build's percentage.
func TestBuildProgressLines(t *testing.T) {
	var out bytes.Buffer
	p := newPullProgress(&out, "default", "waiting")
	out.Reset()
	for _, pct := range []int{0, 3, 12, 15, 55, 97} {
		p.update(protocol.Snapshot{Status: protocol.SnapshotBuilding, BuildStep: "step", BuildPercent: pct})
	}
	p.update(protocol.Snapshot{Status: protocol.SnapshotReady})
	p.finish()
	if want := "  0% step\n 12% step\n 55% step\n 97% step\n"; out.String() != want {
		t.Fatalf("progress lines:\n%q\nwant\n%q", out.String(), want)
	}
	if got := snapshotStatus(protocol.Snapshot{Status: protocol.SnapshotBuilding, BuildStep: "x", BuildPercent: 40, Builtin: true}); got != "building 40% (built-in)" {
		t.Errorf("status of a building built-in: %q", got)
	}
	if got := snapshotStatus(protocol.Snapshot{Status: protocol.SnapshotReady}); got != "ready" {
		t.Errorf("status of a workspace's snapshot: %q", got)
	}
}

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// TestPauseInsideSentry: Pause stops the sandbox's tasks (a counter
// writing to its upper dir stands still) through runsc, never through the
// host cgroup freezer, whose wake-ups kill systrap sandboxes (see Pause);
// runsc reports it paused and its host processes are not frozen. Resume
// makes it count again, and resuming a running sandbox is fine.
func TestPauseInsideSentry(t *testing.T) {
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{MemBytes: 256 << 20})
	ctx := context.Background()
	s.sh(t, `i=0; (while true; do i=$((i+1)); echo $i > /root/c; sleep 0.05; done) >/dev/null 2>&1 &`)
	counter := func() string {
		b, _ := os.ReadFile(filepath.Join(s.upper, "root", "c"))
		return strings.TrimSpace(string(b))
	}
	time.Sleep(300 * time.Millisecond)
	if err := d.Pause(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	at := counter()
	if frozen(runtime.FreezerDir(s.id)) {
		t.Error("Pause froze the host processes in the cgroup freezer")
	}
	// A frozen Sentry would not even answer runsc state.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := d.run(sctx, "state", s.id)
	if err != nil || !strings.Contains(string(out), `"paused"`) {
		t.Errorf("runsc state after Pause: %s %v", out, err)
	}
	time.Sleep(300 * time.Millisecond)
	if got := counter(); got != at {
		t.Errorf("counter went on while paused: %s then %s", at, got)
	}
	for range 2 { // the second Resume finds it running
		if err := d.Resume(ctx, s.id); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	if got := counter(); got == at {
		t.Fatalf("counter stuck at %s after Resume", at)
	}
}

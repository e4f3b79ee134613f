package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Pauser is implemented by drivers that can freeze every process of a
// running sandbox in place and thaw it again. The manager freezes a sandbox
// for the few milliseconds it takes to snapshot its upper dir, so the
// snapshot is a consistent point in time while the sandbox keeps running.
// It is optional: without it the manager captures a stopped sandbox only.
type Pauser interface {
	// Pause freezes sandbox id. It returns once no task of the sandbox can
	// run (and so none can write to its filesystem).
	Pause(ctx context.Context, id string) error
	// Resume thaws sandbox id. Resuming a sandbox that is not paused is
	// not an error.
	Resume(ctx context.Context, id string) error
}

// FreezerDir is sandbox id's cgroup v1 freezer directory, where both drivers
// place it when the host has that hierarchy.
func FreezerDir(id string) string {
	return filepath.Join("/sys/fs/cgroup/freezer", CgroupParent, id)
}

// Freeze sets the cgroup v1 freezer at dir to FROZEN (frozen) or THAWED
// and waits until the kernel reports that state: FREEZING means some task
// has not stopped yet.
func Freeze(ctx context.Context, dir string, frozen bool) error {
	want := "THAWED"
	if frozen {
		want = "FROZEN"
	}
	state := filepath.Join(dir, "freezer.state")
	if err := os.WriteFile(state, []byte(want), 0); err != nil {
		return fmt.Errorf("freezer %s: %w", dir, err)
	}
	for delay := 100 * time.Microsecond; ; {
		b, err := os.ReadFile(state)
		if err != nil {
			return fmt.Errorf("freezer %s: %w", dir, err)
		}
		if strings.TrimSpace(string(b)) == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("freezer %s: still %s: %w", dir, strings.TrimSpace(string(b)), ctx.Err())
		case <-time.After(delay):
		}
		if delay < 10*time.Millisecond {
			delay *= 2
		}
		// Writing again nudges tasks that were busy when asked first.
		os.WriteFile(state, []byte(want), 0)
	}
}

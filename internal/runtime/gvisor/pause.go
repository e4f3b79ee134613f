package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Pauser = (*Driver)(nil)

// Pause freezes every process of sandbox id: the Sentry, the gofer and the
// systrap stubs. runsc places them all in the sandbox's cgroup, so where
// the host has the cgroup v1 freezer it is used directly (a file write,
// ~1 ms); otherwise `runsc pause` stops the tasks inside the Sentry (a
// runsc invocation, ~25 ms). Either way nothing in the sandbox writes to
// its upper dir until Resume, and open files, sockets and timers survive.
func (d *Driver) Pause(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("pause sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if dir, ok := freezer(id); ok {
		if err := runtime.Freeze(ctx, dir, true); err != nil {
			runtime.Freeze(context.WithoutCancel(ctx), dir, false)
			return fmt.Errorf("pause sandbox %s: %w", id, err)
		}
		return nil
	}
	if _, err := d.run(ctx, "pause", id); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume thaws sandbox id (the same way Pause froze it).
func (d *Driver) Resume(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("resume sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if ok, err := d.resumeCheckpointed(ctx, id); ok {
		if err != nil {
			return fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		return nil
	}
	if dir, ok := freezer(id); ok {
		if err := runtime.Freeze(ctx, dir, false); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", id, err)
		}
		return nil
	}
	if _, err := d.run(ctx, "resume", id); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

// freezer returns sandbox id's freezer cgroup when it holds its processes.
func freezer(id string) (string, bool) {
	dir := runtime.FreezerDir(id)
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	return dir, err == nil && len(b) > 0
}

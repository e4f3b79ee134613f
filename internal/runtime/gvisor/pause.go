package gvisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Pauser = (*Driver)(nil)

// Pause stops every task of sandbox id inside the Sentry (`runsc pause`,
// ~25 ms); the host processes (Sentry, gofer, systrap stubs) keep running.
// Nothing in the sandbox writes to its upper dir until Resume, and open
// files, sockets and timers survive.
//
// The host's cgroup v1 freezer must not be used, fast as it is: freezing
// signals every task, and a systrap stub blocked in a seccomp user
// notification is then woken, which withdraws its pending notification
// but leaves the notifier's request count raised. A later
// SECCOMP_IOCTL_NOTIF_RECV of the Sentry finds that stale count with no
// notification behind it, fails with ENOENT, and systrap answers by
// SIGKILLing the stub, which kills the sandbox, often many milliseconds
// after the thaw (at the next host syscall a stub makes for the Sentry,
// e.g. the mappings re-made after a checkpoint).
func (d *Driver) Pause(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("pause sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if _, err := d.run(ctx, "pause", id); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume undoes Pause (and Checkpoint). Resuming a running sandbox is not
// an error. A sandbox left frozen in the cgroup freezer by an older daemon
// is thawed too.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("resume sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if dir := runtime.FreezerDir(id); frozen(dir) {
		if err := runtime.Freeze(ctx, dir, false); err != nil {
			return fmt.Errorf("resume sandbox %s: %w", id, err)
		}
	}
	if _, err := d.run(ctx, "resume", id); err != nil && !strings.Contains(err.Error(), "in state running") {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

// frozen reports whether the cgroup freezer at dir holds its tasks.
func frozen(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
	return err == nil && strings.TrimSpace(string(b)) != "THAWED"
}

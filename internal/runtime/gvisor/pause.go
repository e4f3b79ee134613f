package gvisor

import (
	"context"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Pauser = (*Driver)(nil)

// Pause stops every task of sandbox id inside the Sentry (`runsc pause`).
// The Sentry and gofer stay up, so open files, sockets and timers survive;
// nothing in the sandbox writes to its upper dir until Resume.
func (d *Driver) Pause(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("pause sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if _, err := d.run(ctx, "pause", id); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume restarts the tasks of a paused sandbox (`runsc resume`); a
// sandbox that is already running is left alone.
func (d *Driver) Resume(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("resume sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if _, err := d.run(ctx, "resume", id); err != nil {
		if strings.Contains(err.Error(), "not paused") || strings.Contains(err.Error(), "running") {
			return nil
		}
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

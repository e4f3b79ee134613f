package gvisor

import (
	"context"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// SetIdentity implements runtime.Identifier: `runsc exec` starts
// `cubicle set-identity` inside the sandbox with CAP_SYS_ADMIN (of the
// Sentry's kernel), which sethostname needs and the agent does not hold.
// It runs before any tenant command, at a warm-pool claim.
func (d *Driver) SetIdentity(ctx context.Context, id, hostname, machineID string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("set identity of sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if _, err := d.run(ctx, "exec", "--cap", "CAP_SYS_ADMIN", id, runtime.AgentMountPath, "set-identity", hostname, machineID); err != nil {
		return fmt.Errorf("set identity of sandbox %s: %w", id, err)
	}
	return nil
}

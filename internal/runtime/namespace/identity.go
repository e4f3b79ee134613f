package namespace

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// SetIdentity implements runtime.Identifier: nsenter(1) runs `cubicle
// set-identity` in the sandbox's user, UTS and mount namespaces and root,
// as the sandbox's root with the capabilities the agent dropped. It runs
// before any tenant command, at a warm-pool claim.
func (d *Driver) SetIdentity(ctx context.Context, id, hostname, machineID string) error {
	pid, err := d.PID(ctx, id)
	if err != nil {
		return fmt.Errorf("set identity of sandbox %s: %w", id, err)
	}
	if pid == 0 {
		return fmt.Errorf("set identity of sandbox %s: not running: %w", id, errdefs.ErrNotFound)
	}
	out, err := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(pid), "-U", "-u", "-m", "-r", "-w", "--",
		runtime.AgentMountPath, "set-identity", hostname, machineID).CombinedOutput()
	if err != nil {
		return fmt.Errorf("set identity of sandbox %s: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

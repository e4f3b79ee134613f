package gvisor

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Explainer = (*Driver)(nil)

// sentryLog is the Sentry's log in the bundle dir.
const sentryLog = "sentry.log"

// ExitCause implements runtime.Explainer from what the Sentry logged as it
// went. The gofer's death and PID 1's exit are logged within microseconds
// of each other, in either order, so the order does not tell: PID 1 ending
// other than by SIGKILL ended on its own (a gofer's death makes the Sentry
// SIGKILL it); a Sentry that logged nothing was killed from outside
// (SIGKILL leaves no word). Without a log (a debug log elsewhere) it
// cannot tell.
func (d *Driver) ExitCause(id string) string {
	path := filepath.Join(d.bundleDir(id), sentryLog)
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	log := tailFile(path, 64<<10)
	var exit string
	if _, rest, ok := strings.Cut(log, "application exiting with "); ok {
		exit, _, _ = strings.Cut(rest, "\n")
		exit = strings.TrimSpace(exit)
	}
	switch {
	case strings.Contains(log, "subprocess died") || strings.Contains(log, "has been killed by SIGKILL"):
		return "a systrap stub process of its Sentry was killed"
	case exit != "" && exit != "killed by signal 9":
		return "its PID 1 (the agent) exited: " + exit
	case strings.Contains(log, "Gofer socket disconnected"):
		return "its gofer (the runsc process serving its files) died"
	case exit != "":
		return "its PID 1 (the agent) was killed by signal 9"
	}
	return "its Sentry (the runsc sandbox process) was killed"
}

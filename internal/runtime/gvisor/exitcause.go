package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Explainer = (*Driver)(nil)

// The Sentry's and the gofer's logs in the bundle dir (runsc's
// --debug-log with %COMMAND%, at info level).
const (
	sentryLog = "boot.log"
	goferLog  = "gofer.log"
)

// goferExited is the line a gofer logs last when it ends on its own (its
// sandbox went first); a killed gofer logs nothing more.
const goferExited = "Exiting with status"

// goferExitWait bounds how long ExitCause waits for a gofer to log its
// orderly exit: it ends after the Sentry, so right after the Sentry's exit
// its last line may not be written yet (on a loaded host it trailed by tens of milliseconds); bounded well below a client's first reconnect (500 ms in the Go SDK), which must find the sandbox already stopped.
const goferExitWait = 200 * time.Millisecond

// ExitCause implements runtime.Explainer from what the Sentry logged as it
// went. The gofer's death and PID 1's exit are logged within microseconds
// of each other, in either order, so the order does not tell: PID 1 ending
// other than by SIGKILL ended on its own (a gofer's death makes the Sentry
// SIGKILL it); a Sentry that logged nothing was killed from outside
// (SIGKILL leaves no word). A SIGKILLed PID 1 takes the container down
// and its gofer with it, which the Sentry may log as a disconnect before
// the exit: the gofer died first only if its own log does not end with
// its orderly exit. Without a log (a debug log elsewhere) it cannot tell.
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
	case strings.Contains(log, "Gofer socket disconnected") && !goferExitedOrderly(filepath.Join(d.bundleDir(id), goferLog)):
		return "its gofer (the runsc process serving its files) died"
	case exit != "":
		return "its PID 1 (the agent) was killed by signal 9"
	}
	return "its Sentry (the runsc sandbox process) was killed"
}

// goferExitedOrderly reports whether the gofer log at path ends with the
// gofer's own exit, waiting up to goferExitWait for it.
func goferExitedOrderly(path string) bool {
	deadline := time.Now().Add(goferExitWait)
	for {
		if strings.Contains(tailFile(path, 4<<10), goferExited) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

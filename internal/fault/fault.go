// Package fault provides named crash points for crash-consistency tests:
// with CUBICLE_FAULT_POINT=<name> in its environment, the daemon kills
// itself with SIGKILL — no deferred cleanup, no flushed buffers, as a
// power cut or an OOM kill would — the first time it reaches that point.
// Without the variable every point is a no-op. Production never sets it.
package fault

import (
	"log/slog"
	"os"
	"syscall"
)

// EnvVar names the point to crash at.
const EnvVar = "CUBICLE_FAULT_POINT"

// Points, in lifecycle order. Each sits between two effects a crash must
// not leave inconsistent (a database write and the host state it
// describes, or two host effects).
const (
	CreateRecorded      = "create.recorded"      // record written (provisioning), nothing built
	BootPrepared        = "boot.prepared"        // first boot: instance up (rootfs, netns, runtime, agent), record not yet ready
	StartRecorded       = "start.recorded"       // restart: new agent token written, nothing booted, record stopped
	StartPrepared       = "start.prepared"       // restart: instance up, record still stopped
	StopHalted          = "stop.halted"          // instance gone, record still ready
	ResetCleared        = "reset.cleared"        // reset: instance gone and upper emptied, record stopped, not booted
	CaptureFrozen       = "capture.frozen"       // sandbox frozen for a filesystem capture, layer not taken
	CaptureCheckpointed = "capture.checkpointed" // memory capture: image saved, sandbox paused, layer not taken
	CaptureLayered      = "capture.layered"      // layer captured (sandbox thawed), snapshot record not written
	ForkCaptured        = "fork.captured"        // fork's snapshot recorded, no branch record written
	ForkRecorded        = "fork.recorded"        // branch records written, none booted
	DeleteTornDown      = "delete.torn-down"     // instance and data gone, record still deleting
	ImageUnpacked       = "image.unpacked"       // a pulled layer unpacked in staging, not published; snapshot building
	BuildStepCaptured   = "build.step-captured"  // a Dockerfile RUN step's layer captured, its build sandbox up, cache entry not written
)

// Injector crashes the process at its point. A nil *Injector is valid
// and never crashes.
type Injector struct {
	point string
	log   *slog.Logger
}

// FromEnv returns the injector CUBICLE_FAULT_POINT asks for, or nil.
func FromEnv(log *slog.Logger) *Injector {
	p := os.Getenv(EnvVar)
	if p == "" {
		return nil
	}
	log.Warn("fault injection armed: the daemon will kill itself at this point", "point", p)
	return &Injector{point: p, log: log}
}

// Hit kills the process if name is the armed point.
func (i *Injector) Hit(name string) {
	if i == nil || name != i.point {
		return
	}
	i.log.Warn("fault point reached: killing the daemon", "point", name)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not deliverable late; never go on past the point
}

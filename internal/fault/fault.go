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

// Points the sandbox manager passes, in lifecycle order. Each sits between
// two effects a crash must not leave inconsistent.
const (
	CreateRecorded = "create.recorded"  // record written (provisioning), nothing built
	BootPrepared   = "boot.prepared"    // instance up (rootfs, netns, runtime, agent), record not yet ready
	StopHalted     = "stop.halted"      // instance gone, record still ready
	CaptureLayered = "capture.layered"  // layer captured (sandbox thawed), snapshot record not written
	DeleteTornDown = "delete.torn-down" // instance and data gone, record still deleting
	ForkRecorded   = "fork.recorded"    // branch records written, none booted
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

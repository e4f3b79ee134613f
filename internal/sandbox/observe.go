package sandbox

import (
	"context"
	"time"
)

// Observer watches the manager's timed operations for metrics and traces
// (internal/telemetry implements it), so the lifecycle core depends on no
// metrics or tracing library. Implementations must be cheap and safe for
// concurrent use; they must not fail an operation.
type Observer interface {
	// Begin starts operation op (one of the Op constants) on sandbox id.
	// The returned context carries whatever the observer needs to parent
	// the operation's phases; end is called once, with the operation's
	// error.
	Begin(ctx context.Context, op, id string) (_ context.Context, end func(error))
	// Phase records one completed phase of the operation begun in ctx.
	Phase(ctx context.Context, op, phase string, start, end time.Time)
}

// The operations an Observer sees, and the phases of a boot (create and
// start), in the order they run; rootfs and network overlap (both start
// with the boot and egress waits for both).
const (
	OpCreate  = "create"
	OpStart   = "start"
	OpStop    = "stop"
	OpCapture = "capture"
	OpFork    = "fork"

	PhaseQueue   = "queue" // waiting for a boot slot (HostCapacity.MaxBoots)
	PhaseRootFS  = "rootfs"
	PhaseNetwork = "network"
	PhaseEgress  = "egress"
	PhaseDriver  = "driver"
	PhaseAgent   = "agent"
)

// nopObserver is the Observer of a manager configured without one.
type nopObserver struct{}

func (nopObserver) Begin(ctx context.Context, _, _ string) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (nopObserver) Phase(context.Context, string, string, time.Time, time.Time) {}

// phase is one timed step of a boot.
type phase struct {
	name       string
	start, end time.Time
}

// observePhases hands a boot's phases to the observer and returns them as
// slog attributes (name, duration pairs).
func (m *Manager) observePhases(ctx context.Context, op string, phases []phase) []any {
	attrs := make([]any, 0, 2*len(phases))
	for _, p := range phases {
		m.cfg.Observer.Phase(ctx, op, p.name, p.start, p.end)
		attrs = append(attrs, p.name, p.end.Sub(p.start))
	}
	return attrs
}

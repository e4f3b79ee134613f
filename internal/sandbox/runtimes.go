package sandbox

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// runtimes are the drivers a daemon serves (Config.Drivers), the default
// first. Each sandbox runs on the one its record names, from its create
// to its deletion: a sandbox cannot move between runtimes (its memory
// images and driver state are its runtime's).
type runtimes []runtime.Driver

// newRuntimes checks ds: at least one driver, names unique.
func newRuntimes(ds []runtime.Driver) (runtimes, error) {
	if len(ds) == 0 {
		return nil, errors.New("sandbox manager: no runtime driver")
	}
	for i, d := range ds {
		if slices.ContainsFunc(ds[:i], func(o runtime.Driver) bool { return o.Name() == d.Name() }) {
			return nil, fmt.Errorf("sandbox manager: runtime %s given twice", d.Name())
		}
	}
	return runtimes(ds), nil
}

// def is the default runtime: of creates that name none, warm pools and
// Dockerfile builds.
func (r runtimes) def() runtime.Driver { return r[0] }

// get returns the driver named name ("" is the default), or false.
func (r runtimes) get(name string) (runtime.Driver, bool) {
	if name == "" {
		return r.def(), true
	}
	i := slices.IndexFunc(r, func(d runtime.Driver) bool { return d.Name() == name })
	if i < 0 {
		return nil, false
	}
	return r[i], true
}

// names lists the runtimes served, the default first, for messages.
func (r runtimes) names() string {
	names := make([]string, len(r))
	for i, d := range r {
		names[i] = d.Name()
	}
	return strings.Join(names, ", ")
}

// forCreate is the driver a create asking for runtime name ("" for the
// default) runs on; a runtime the daemon does not serve is a FieldError.
func (r runtimes) forCreate(name string) (runtime.Driver, error) {
	d, ok := r.get(name)
	if !ok {
		return nil, errdefs.Field("runtime", "this daemon does not serve the %s runtime; it serves %s", name, r.names())
	}
	return d, nil
}

// driverOf is the driver sandbox sb runs on. A record naming a runtime
// this daemon does not serve (it was started with fewer) is a conflict:
// the sandbox keeps its runtime and starts again under a daemon serving it.
func (m *Manager) driverOf(sb *store.Sandbox) (runtime.Driver, error) {
	d, ok := m.rt.get(sb.Runtime)
	if !ok {
		return nil, fmt.Errorf("sandbox %s runs on the %s runtime, which this daemon does not serve (it serves %s): %w",
			sb.Name, sb.Runtime, m.rt.names(), errdefs.ErrConflict)
	}
	return d, nil
}

// servedDriver is driverOf for teardowns: nil for a runtime this daemon
// does not serve, which has no instance here to stop (logged), so the
// rest of a stop or delete still goes ahead.
func (m *Manager) servedDriver(sb *store.Sandbox) runtime.Driver {
	d, err := m.driverOf(sb)
	if err != nil {
		m.log.Warn("runtime instance not stopped", "sandbox", sb.ID, "err", err)
	}
	return d
}

// Runtimes lists the runtimes served, the default first.
func (m *Manager) Runtimes() []protocol.ServedRuntime {
	out := make([]protocol.ServedRuntime, len(m.rt))
	for i, d := range m.rt {
		out[i] = protocol.ServedRuntime{Name: d.Name(), Accelerator: accelOf(d)}
	}
	return out
}

func accelOf(d runtime.Driver) string {
	if a, ok := d.(runtime.Accelerated); ok {
		return a.Accel()
	}
	return ""
}

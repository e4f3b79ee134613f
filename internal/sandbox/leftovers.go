package sandbox

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Kinds of Leftover.
const (
	LeftoverRuntime = "runtime" // a driver instance or its state
	LeftoverNetwork = "network" // a netns, veth pair and address
	LeftoverStorage = "storage" // a rootfs mount, storage dir or volume
	LeftoverCapture = "capture" // a captured layer no snapshot or build cache entry holds
	// LeftoverVolume and LeftoverVolumeSnapshot are files no volume (or
	// volume snapshot) record has: a crash between making them and the
	// record, or between a record's deletion and theirs.
	LeftoverVolume         = "volume"
	LeftoverVolumeSnapshot = "volume-snapshot"
)

// Leftover is host state held under a runtime id that no sandbox record
// has: what a crash between a record's deletion and its cleanup, or a
// record lost with its database, leaves behind.
type Leftover = protocol.Leftover

// Leftovers lists the runtime instances (runtime by runtime, in the
// order served), network endpoints and storage held by ids no sandbox
// record has, then captured layers no snapshot or build cache entry has,
// then volume files no volume record has, in that order, each sorted by
// id. An instance on a runtime other than its record's is a leftover of
// that runtime.
func (m *Manager) Leftovers(ctx context.Context) ([]Leftover, error) {
	sandboxes, err := m.cfg.Store.AllSandboxes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list leftovers: %w", err)
	}
	// known maps each id in use to its runtime's name ("" for any: an id
	// in use without a record is its runtime's however it runs).
	known := make(map[string]string, len(sandboxes))
	for _, sb := range sandboxes {
		rt := sb.Runtime
		if rt == "" {
			rt = m.rt.def().Name()
		}
		known[runtimeID(sb.ID)] = rt
	}
	m.mu.Lock()
	for rid := range m.transient {
		known[rid] = ""
	}
	m.mu.Unlock()
	type lister struct {
		kind, runtime string
		list          func(context.Context) ([]string, error)
	}
	var listers []lister
	for _, d := range m.rt {
		if l, ok := d.(runtime.Lister); ok {
			listers = append(listers, lister{LeftoverRuntime, d.Name(), l.List})
		}
	}
	listers = append(listers, lister{kind: LeftoverNetwork, list: m.cfg.Network.List}, lister{kind: LeftoverStorage, list: m.cfg.Storage.List})
	var out []Leftover
	for _, l := range listers {
		ids, err := l.list(ctx)
		if err != nil {
			return nil, fmt.Errorf("list %s leftovers: %w", l.kind, err)
		}
		slices.Sort(ids)
		for _, id := range ids {
			if rt, ok := known[id]; !ok || l.runtime != "" && rt != "" && rt != l.runtime {
				out = append(out, Leftover{Kind: l.kind, ID: id, Runtime: l.runtime})
			}
		}
	}
	captures, err := m.captureLeftovers(ctx)
	if err != nil {
		return nil, err
	}
	vols, err := m.volumeLeftovers(ctx)
	return append(append(out, captures...), vols...), err
}

// captureLeftovers lists captured layers (and memory images) that no
// snapshot, build cache entry or sandbox holds (a crash between a capture
// and its record); a capture in progress holds its id (holdTransient). While a
// Dockerfile build runs it reports none: a build's fresh layer is
// recorded only when its step ends (the cache's pruning waits the same way).
func (m *Manager) captureLeftovers(ctx context.Context) ([]Leftover, error) {
	if !m.buildGate.TryLock() {
		return nil, nil
	}
	defer m.buildGate.Unlock()
	owners, err := m.cfg.Store.LayerOwners(ctx)
	if err != nil {
		return nil, fmt.Errorf("list capture leftovers: %w", err)
	}
	ids, err := m.cfg.Storage.ListCaptures(ctx)
	if err != nil {
		return nil, fmt.Errorf("list capture leftovers: %w", err)
	}
	m.mu.Lock()
	for id := range m.transient {
		owners[id] = true
	}
	m.mu.Unlock()
	var out []Leftover
	for _, id := range ids {
		if !owners[id] {
			out = append(out, Leftover{Kind: LeftoverCapture, ID: id})
		}
	}
	return out, nil
}

// CleanLeftovers stops the instances, tears down the endpoints and
// unmounts the storage of ids no sandbox record has, moving their data
// aside (Storage.Quarantine) rather than deleting it. It returns what it
// cleaned, with where data went; one leftover that fails to clean does not
// stop the others.
func (m *Manager) CleanLeftovers(ctx context.Context) ([]Leftover, error) {
	found, err := m.Leftovers(ctx)
	if err != nil {
		return nil, err
	}
	var errs []error
	done := make([]Leftover, 0, len(found))
	for _, l := range found {
		var err error
		switch l.Kind {
		case LeftoverRuntime:
			d, _ := m.rt.get(l.Runtime) // Leftovers listed it from a served runtime
			err = d.Stop(ctx, l.ID)
		case LeftoverNetwork:
			err = m.cfg.Network.Teardown(ctx, l.ID)
		case LeftoverStorage:
			l.Moved, err = m.cfg.Storage.Quarantine(ctx, l.ID)
		case LeftoverCapture:
			l.Moved, err = m.cfg.Storage.QuarantineCapture(ctx, l.ID)
		case LeftoverVolume, LeftoverVolumeSnapshot:
			l.Moved, err = m.cfg.Storage.QuarantineVolumeFiles(ctx, l.Kind == LeftoverVolumeSnapshot, l.ID)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("clean %s leftover %s: %w", l.Kind, l.ID, err))
			continue
		}
		m.log.Warn("cleaned up state of a sandbox the database does not know", "kind", l.Kind, "id", l.ID, "moved_to", l.Moved)
		done = append(done, l)
	}
	return done, errors.Join(errs...)
}

// holdTransient marks id as in use without a record (a build step's
// runtime id, a capture's snapshot id) until the returned release is
// called.
func (m *Manager) holdTransient(rid string) (release func()) {
	m.mu.Lock()
	m.transient[rid] = true
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.transient, rid)
		m.mu.Unlock()
	}
}

package sandbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Recorder receives every sandbox's lifecycle events, for its audit
// record (internal/record implements it). It must not block: the manager
// calls it under a sandbox's lifecycle lock. The actor is the API caller
// in ctx, or system when there is none (the reaper, a sandbox dying).
type Recorder interface {
	Record(ctx context.Context, e record.Event)
}

// nopRecorder records nothing: the default without Config.Recorder.
type nopRecorder struct{}

func (nopRecorder) Record(context.Context, record.Event) {}

// emit records lifecycle event typ of sb with data (nil for none).
func (m *Manager) emit(ctx context.Context, sb *store.Sandbox, typ string, data any) {
	m.cfg.Recorder.Record(context.WithoutCancel(ctx), record.Event{SandboxID: sb.ID, WorkspaceID: sb.WorkspaceID,
		Kind: protocol.KindLifecycle, Type: typ, Data: data})
}

type requestKindKey struct{}

// WithRequestKind marks ctx as a dataplane request of kind (execute,
// exec_ws, upload, download): a sandbox it wakes records being woken by it.
func WithRequestKind(ctx context.Context, kind string) context.Context {
	return context.WithValue(ctx, requestKindKey{}, kind)
}

// wokenBy is the request kind that woke a sandbox booting under ctx, or ""
// for a boot that is no wake-up (create, start, reset).
func wokenBy(ctx context.Context) string {
	k, _ := ctx.Value(requestKindKey{}).(string)
	return k
}

// stopReason tells the record why a sandbox stopped; message is its
// status message, when it has one.
type stopReason struct {
	Reason  string `json:"reason"`
	Message string `json:"message,omitempty"`
}

// createdData is a created event's data: what the sandbox was made from
// and its limits.
func createdData(sb *store.Sandbox) map[string]any {
	d := map[string]any{"name": sb.Name, "snapshot_id": sb.SnapshotID, "runtime": sb.Runtime,
		"vcpus": sb.VCPUs, "mem_bytes": sb.MemBytes, "fs_capacity_bytes": sb.FSCapacityBytes,
		"idle_ttl_seconds": sb.IdleTTLSeconds, "delete_after_stop_seconds": sb.DeleteAfterStopSeconds,
		"proxy_config": hasJSON(sb.ProxyConfig)}
	if len(sb.Volumes) > 0 {
		d["volumes"] = VolumeAttachments(sb)
	}
	return d
}

// policyChange is a policy_changed event's data: the fields an update
// changed. TTLs carry their old and new values; run_config and
// proxy_config only their names, as their values may hold secrets.
type policyChange struct {
	Fields                 []string  `json:"fields"`
	IdleTTLSeconds         *[2]int64 `json:"idle_ttl_seconds,omitempty"`
	DeleteAfterStopSeconds *[2]int64 `json:"delete_after_stop_seconds,omitempty"`
}

// policyDiff is what req changes of before's policies, or nil for none.
func policyDiff(before *store.Sandbox, req protocol.UpdateSandboxRequest, proxyChanged bool) *policyChange {
	var c policyChange
	if proxyChanged {
		c.Fields = append(c.Fields, "proxy_config")
	}
	if req.RunConfig != nil {
		c.Fields = append(c.Fields, "run_config")
	}
	if req.Volumes != nil {
		c.Fields = append(c.Fields, "volumes")
	}
	if v := req.IdleTTLSeconds; v != nil && *v != before.IdleTTLSeconds {
		c.Fields = append(c.Fields, "idle_ttl_seconds")
		c.IdleTTLSeconds = &[2]int64{before.IdleTTLSeconds, *v}
	}
	if v := req.DeleteAfterStopSeconds; v != nil && *v != before.DeleteAfterStopSeconds {
		c.Fields = append(c.Fields, "delete_after_stop_seconds")
		c.DeleteAfterStopSeconds = &[2]int64{before.DeleteAfterStopSeconds, *v}
	}
	if len(c.Fields) == 0 {
		return nil
	}
	slices.Sort(c.Fields)
	return &c
}

// emitStarted records a finished boot: woken when a dataplane request
// caused it (wokenBy), else started.
func (m *Manager) emitStarted(ctx context.Context, sb *store.Sandbox, first, restored bool, took time.Duration) {
	typ, data := protocol.EventStarted, map[string]any{"first": first, "restored": restored, "boot_ms": took.Milliseconds()}
	if by := wokenBy(ctx); by != "" && !first {
		typ, data["by"] = protocol.EventWoken, by
	}
	m.emit(ctx, sb, typ, data)
}

// emitForked records a fork on the parent (with its branches) and on each
// branch (with its parent), so either record leads to the other.
func (m *Manager) emitForked(ctx context.Context, parent *store.Sandbox, snapshotID string, branches []*store.Sandbox) {
	refs := make([]protocol.SandboxRef, len(branches))
	for i, b := range branches {
		refs[i] = protocol.SandboxRef{ID: b.ID, Name: b.Name}
		m.emit(ctx, b, protocol.EventForked, map[string]any{"snapshot_id": snapshotID, "parent": protocol.SandboxRef{ID: parent.ID, Name: parent.Name}})
	}
	m.emit(ctx, parent, protocol.EventForked, map[string]any{"snapshot_id": snapshotID, "children": refs})
}

// FileLayers is where sandboxID's files are, for the record's file
// events: its upper dir and the snapshot layers below it, bottom first.
// It reads the store directly: the daemon, not a caller, asks.
func (m *Manager) FileLayers(ctx context.Context, sandboxID string) (upper string, lowers []string, err error) {
	sb, err := m.cfg.Store.GetSandboxByID(ctx, sandboxID)
	if err != nil {
		return "", nil, fmt.Errorf("file layers of %s: %w", sandboxID, err)
	}
	sn, err := m.cfg.Store.GetSnapshot(ctx, sb.WorkspaceID, sb.SnapshotID)
	if err != nil {
		return "", nil, fmt.Errorf("file layers of %s: snapshot: %w", sandboxID, err)
	}
	return m.cfg.Storage.UpperDir(runtimeID(sb.ID)), sn.Layers, nil
}

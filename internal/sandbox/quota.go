package sandbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/keyed"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// quotaRetryAfter is the Retry-After of a quota refusal: room frees up
// only when the workspace stops or deletes something, so a client should
// not poll fast.
const quotaRetryAfter = 30 * time.Second

// quotaGate is the one place a workspace's quotas are checked. Every path
// that adds to a workspace's usage goes through it: create and fork
// (admit, around the record inserts), start and the automatic wake of a
// dataplane or gateway request (reserve, around the boot), snapshot
// builds (admit) and captures (reserve, around the copy).
//
// A check and the write that makes its claim visible to the next check
// happen under the workspace's quota lock, so two concurrent claims never
// both take the last unit. The visible write is either the record (a new
// sandbox counts from the moment it is provisioning) or, for work that
// changes usage only when it ends (a wake turns a stopped sandbox ready;
// a capture records its snapshot last), an in-memory reservation held
// until that work has recorded its outcome. A reservation may briefly
// overlap the record it becomes, which can only refuse, never admit, too
// much.
//
// Lock order (with box.go's): box.lock, then the workspace's quota lock,
// then quotaGate.mu (a leaf). Nothing takes a box.lock or waits on a boot
// while holding a quota lock.
type quotaGate struct {
	st    store.Store
	locks keyed.Locks[string] // per workspace id

	mu       sync.Mutex
	reserved map[string]map[uint64]store.Usage // workspace → reservation → what it claims
	next     uint64
}

func newQuotaGate(st store.Store) *quotaGate {
	return &quotaGate{st: st, reserved: map[string]map[uint64]store.Usage{}}
}

// admit checks that workspace ws may take claim c and, if so, runs commit
// (which records the claim) before any other claim on ws is checked.
func (g *quotaGate) admit(ctx context.Context, ws string, c store.Usage, commit func() error) error {
	unlock, err := g.locks.Lock(ctx, ws)
	if err != nil {
		return fmt.Errorf("wait for quota check of workspace %s: %w", ws, err)
	}
	defer unlock()
	if err := g.check(ctx, ws, c); err != nil {
		return err
	}
	return commit()
}

// reserve checks that workspace ws may take claim c and holds it until
// release is called, which must be once the work has recorded its outcome.
func (g *quotaGate) reserve(ctx context.Context, ws string, c store.Usage) (release func(), err error) {
	unlock, err := g.locks.Lock(ctx, ws)
	if err != nil {
		return nil, fmt.Errorf("wait for quota check of workspace %s: %w", ws, err)
	}
	defer unlock()
	if err := g.check(ctx, ws, c); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.next++
	id := g.next
	if g.reserved[ws] == nil {
		g.reserved[ws] = map[uint64]store.Usage{}
	}
	g.reserved[ws][id] = c
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			delete(g.reserved[ws], id)
			if len(g.reserved[ws]) == 0 {
				delete(g.reserved, ws)
			}
		})
	}, nil
}

// check returns a LimitError if ws's usage (recorded plus reserved) with
// c would exceed one of its quotas. Callers hold ws's quota lock.
func (g *quotaGate) check(ctx context.Context, ws string, c store.Usage) error {
	q, err := g.st.GetQuota(ctx, ws)
	if err != nil {
		return err
	}
	if q == (store.Quota{}) {
		return nil // unlimited: no need to measure
	}
	u, err := g.st.WorkspaceUsage(ctx, ws)
	if err != nil {
		return err
	}
	g.mu.Lock()
	for _, r := range g.reserved[ws] {
		u = addUsage(u, r)
	}
	g.mu.Unlock()
	return exceeds(q, u, c)
}

// addUsage returns a+b.
func addUsage(a, b store.Usage) store.Usage {
	return store.Usage{Sandboxes: a.Sandboxes + b.Sandboxes, VCPUs: a.VCPUs + b.VCPUs, MemBytes: a.MemBytes + b.MemBytes,
		StorageBytes: a.StorageBytes + b.StorageBytes, Snapshots: a.Snapshots + b.Snapshots}
}

// exceeds returns a LimitError for the first quota of q that usage u plus
// claim c would exceed; a quota c does not add to is never refused, so
// lowering a quota below what a workspace holds blocks growth, not use.
//
// The official clients classify a 429 by its message (spec §7.1: "sandbox"
// with "count" or "limit" first, then "cpu", "memory", "storage"), so a
// message names only its own kind's words: no "sandbox" outside the
// sandbox count, no "cpu" in the memory or storage ones.
func exceeds(q store.Quota, u, c store.Usage) error {
	for _, l := range []struct {
		kind, what, unit string
		max              *int64
		used, add        int64
	}{
		{errdefs.QuotaSandboxes, "sandboxes", "", q.MaxSandboxes, u.Sandboxes, c.Sandboxes},
		{errdefs.QuotaCPU, "running vCPUs", "", q.MaxVCPUs, u.VCPUs, c.VCPUs},
		{errdefs.QuotaMemory, "running memory", " bytes", q.MaxMemBytes, u.MemBytes, c.MemBytes},
		{errdefs.QuotaStorage, "declared storage (fs_capacity_bytes and volume sizes)", " bytes", q.MaxStorageBytes, u.StorageBytes, c.StorageBytes},
		{errdefs.QuotaSnapshots, "snapshots", "", q.MaxSnapshots, u.Snapshots, c.Snapshots},
	} {
		if l.max == nil || l.add <= 0 || l.used+l.add <= *l.max {
			continue
		}
		return &errdefs.LimitError{Kind: l.kind, RetryAfter: quotaRetryAfter,
			Msg: fmt.Sprintf("%s would be %d%s; the workspace allows %d%s (%d in use)", l.what, l.used+l.add, l.unit, *l.max, l.unit, l.used)}
	}
	return nil
}

// newSandboxClaim is what creating sb adds: one sandbox, its declared
// storage, and (creates start it) its vCPUs and memory.
func newSandboxClaim(sb *store.Sandbox) store.Usage {
	return store.Usage{Sandboxes: 1, VCPUs: sb.VCPUs, MemBytes: sb.MemBytes, StorageBytes: sb.FSCapacityBytes}
}

// runClaim is what starting stopped or failed sandbox sb adds.
func runClaim(sb *store.Sandbox) store.Usage {
	return store.Usage{VCPUs: sb.VCPUs, MemBytes: sb.MemBytes}
}

// resizeClaim is what resizing sb as req asks adds: the growth of its
// declared storage and, while it runs, of its vCPUs and memory (a stopped
// sandbox claims those when it starts).
func resizeClaim(sb *store.Sandbox, req protocol.UpdateSandboxRequest) store.Usage {
	grow := func(to *int64, from int64) int64 { return max(or(to, from)-from, 0) }
	c := store.Usage{StorageBytes: grow(req.FSCapacityBytes, sb.FSCapacityBytes)}
	if s := statusOf(sb); s == Ready || s == Provisioning {
		c.VCPUs, c.MemBytes = grow(req.VCPUs, sb.VCPUs), grow(req.MemBytes, sb.MemBytes)
	}
	return c
}

// snapshotClaim is what a new snapshot adds. Snapshots count against
// max_snapshots only: their fs_capacity_bytes is a default for sandboxes
// created from them, not storage they hold.
var snapshotClaim = store.Usage{Snapshots: 1}

// WorkspaceQuota returns workspace ws's quotas. Who may ask is the
// caller's (internal/authz) to decide.
func (m *Manager) WorkspaceQuota(ctx context.Context, ws string) (store.Quota, error) {
	return m.cfg.Store.GetQuota(ctx, ws)
}

// SetWorkspaceQuota replaces workspace ws's quotas. It takes the quota
// lock, so no claim is checked half against the old ceilings.
func (m *Manager) SetWorkspaceQuota(ctx context.Context, ws string, q store.Quota) error {
	return m.quota.admit(ctx, ws, store.Usage{}, func() error { return m.cfg.Store.PutQuota(ctx, ws, q) })
}

// WorkspaceUsage measures workspace ws against its quotas now, plus the
// bytes its sandboxes, captured snapshots, volumes and volume snapshots
// hold on the CoW store
// (measured, where the backend can; see Usage).
func (m *Manager) WorkspaceUsage(ctx context.Context, ws string) (u store.Usage, usedBytes int64, err error) {
	if _, err := m.cfg.Store.GetQuota(ctx, ws); err != nil {
		return u, 0, err // an unknown workspace is not found
	}
	if u, err = m.cfg.Store.WorkspaceUsage(ctx, ws); err != nil {
		return u, 0, err
	}
	sbs, err := m.cfg.Store.ListSandboxes(ctx, ws, store.ListOptions{})
	if err != nil {
		return u, 0, err
	}
	sns, err := m.cfg.Store.ListSnapshots(ctx, ws, store.ListOptions{})
	if err != nil {
		return u, 0, err
	}
	used, err := m.Usage(ctx, sbs, sns)
	if err != nil {
		return u, 0, err
	}
	for _, n := range used {
		usedBytes += n
	}
	vb, err := m.volumeBytes(ctx, ws)
	if err != nil {
		return u, 0, err
	}
	return u, usedBytes + vb, nil
}

// scaleUsage returns n times u.
func scaleUsage(u store.Usage, n int64) store.Usage {
	return store.Usage{Sandboxes: u.Sandboxes * n, VCPUs: u.VCPUs * n, MemBytes: u.MemBytes * n,
		StorageBytes: u.StorageBytes * n, Snapshots: u.Snapshots * n}
}

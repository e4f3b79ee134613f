// Package network gives every sandbox its own network namespace, wired to the
// host by a veth pair and fenced in by a host-wide nftables policy.
//
// Shape of one endpoint (a /30 carved from the pool):
//
//	root netns                         sandbox netns (bind-mounted at NetNS)
//	cbXXXXXXXXXX  HostIP/30  <──veth──>  eth0  SandboxIP/30, default via HostIP
//
// Policy (table "inet cubicle" and "ip cubicle", see nft.go) is generic: it
// matches the interface prefix "cb" and the pool, so adding or removing a
// sandbox never changes a rule. A sandbox may open connections only to the
// outside world (masqueraded); it cannot open connections to any host
// address, to other sandboxes, to the pool, or to 169.254.0.0/16. The daemon
// opens connections to the agent at SandboxIP; replies are "established" and
// pass.
//
// Invariants:
//   - An allocation record under Config.StateDir exists for every id that has
//     been Setup and not yet Teardown; it is the source of truth. Links and
//     netns mounts are derived state and are recreated from it (Lookup) after
//     a host reboot.
//   - No two records share a subnet index or a host interface name; records
//     are created only while Manager.allocMu is held, and addresses are
//     allocated and put on the host under the host-wide lock (lockHost).
//   - Operations on one id are serialised by a per-id lock; different ids
//     proceed in parallel apart from the short allocation step.
//
// Host requirements: nf_tables with conntrack, fib and masquerade; IPv4
// forwarding (New turns it on). Another firewall whose FORWARD chain drops
// by default (Docker's iptables setup, say) also sees sandbox traffic, and
// an accept in our table cannot override its drop: such hosts must allow
// the pool there (e.g. in DOCKER-USER). The policy is IPv4-only; IPv6 from
// sandbox veths is dropped and disabled on the host ends.
package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"

	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/keyed"
)

// Defaults used when Config or options leave a field empty.
const (
	// DefaultNetNSDir holds one bind-mounted netns file per sandbox.
	DefaultNetNSDir = "/run/cubicle/netns"
	// HostIfPrefix starts every host-side veth name; the nftables policy
	// matches on it, so nothing else on the host may use it.
	HostIfPrefix = "cb"
	// SandboxIfName is the sandbox end of the veth inside its netns.
	SandboxIfName = "eth0"
	// MTU of both veth ends.
	MTU = 1500
)

// DefaultPool returns the pool used when Config.Pool is left zero.
func DefaultPool() netip.Prefix { return netip.MustParsePrefix("10.244.0.0/16") }

// Config is read from daemon flags.
type Config struct {
	// StateDir holds the persistent allocation records, one JSON file per id
	// (e.g. <data-dir>/network).
	StateDir string
	// Pool is carved into /30s: host side .1, sandbox side .2. All Managers
	// on a host should use non-overlapping pools. Default 10.244.0.0/16.
	Pool netip.Prefix
}

// Option tunes a Manager beyond Config.
type Option func(*Manager)

// WithNetNSDir sets the directory holding the netns bind mounts (default
// DefaultNetNSDir). Tests use a private directory.
func WithNetNSDir(dir string) Option { return func(m *Manager) { m.netnsDir = dir } }

// WithLogger sets the logger used when the context carries none.
func WithLogger(l *slog.Logger) Option { return func(m *Manager) { m.log = l } }

// Endpoint is one sandbox's network attachment.
type Endpoint struct {
	ID        string
	NetNS     string // path of the bind-mounted netns, e.g. /run/cubicle/netns/<id>
	HostIf    string // host-side veth name, HostIfPrefix + 10 hex digits of sha256(id)
	HostIP    netip.Addr
	SandboxIP netip.Addr
	PrefixLen int
}

// Manager owns the sandbox endpoints of one daemon. It is safe for
// concurrent use.
type Manager struct {
	stateDir string
	pool     netip.Prefix
	netnsDir string
	log      *slog.Logger

	allocMu sync.Mutex // guards creation of allocation records

	locks keyed.Locks[string] // per-id locks
}

// New prepares the host: state and netns directories, ip_forward, and the
// nftables tables (installed idempotently; existing rules of the tables are
// replaced atomically, other tables are untouched).
func New(ctx context.Context, cfg Config, opts ...Option) (*Manager, error) {
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("network: state dir: %w", errdefs.ErrInvalid)
	}
	pool := cfg.Pool
	if !pool.IsValid() {
		pool = DefaultPool()
	}
	pool = pool.Masked()
	if !pool.Addr().Is4() || pool.Bits() > 30 {
		return nil, fmt.Errorf("network: pool %s must be an IPv4 prefix of /30 or wider: %w", pool, errdefs.ErrInvalid)
	}
	m := &Manager{
		stateDir: cfg.StateDir,
		pool:     pool,
		netnsDir: DefaultNetNSDir,
		log:      slog.Default(),
	}
	for _, o := range opts {
		o(m)
	}
	if err := os.MkdirAll(m.stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("network: create state dir: %w", err)
	}
	if err := ensureNetNSDir(m.netnsDir); err != nil {
		return nil, fmt.Errorf("network: prepare netns dir: %w", err)
	}
	if err := enableForwarding(); err != nil {
		return nil, fmt.Errorf("network: enable ip_forward: %w", err)
	}
	if err := installRules(pool); err != nil {
		return nil, fmt.Errorf("network: install nftables rules: %w", err)
	}
	return m, nil
}

// Pool returns the address pool this Manager allocates from.
func (m *Manager) Pool() netip.Prefix { return m.pool }

// Setup allocates an address for id and builds its netns and veth. For an id
// already set up it returns the existing endpoint (repairing missing pieces).
// A failure part way leaves nothing behind.
func (m *Manager) Setup(ctx context.Context, id string) (*Endpoint, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	unlock := m.lockID(id)
	defer unlock()

	rec, err := m.readRecord(id)
	switch {
	case err == nil:
		return m.ensure(ctx, rec)
	case !errors.Is(err, errdefs.ErrNotFound):
		return nil, fmt.Errorf("network: setup %s: %w", id, err)
	}

	undo := cleanup.Stack{}
	defer func() {
		if err := undo.Run(ctx); err != nil {
			m.logger(ctx).Warn("network: undo half-made endpoint", "id", id, "err", err)
		}
	}()
	unlockHost, err := m.lockHost()
	if err != nil {
		return nil, fmt.Errorf("network: setup %s: %w", id, err)
	}
	defer unlockHost() // after plumb: the address is on the host by then
	rec, err = m.allocate(id)
	if err != nil {
		return nil, fmt.Errorf("network: setup %s: allocate: %w", id, err)
	}
	undo.Push(func(context.Context) error { return m.removeRecord(id) })
	ep := m.endpoint(rec)
	undo.Push(func(context.Context) error { return m.unplumb(ep) })
	if err := m.plumb(ep); err != nil {
		return nil, fmt.Errorf("network: setup %s: %w", id, err)
	}
	undo.Release()
	m.logger(ctx).Debug("network: endpoint up", "id", id, "sandbox_ip", ep.SandboxIP, "host_if", ep.HostIf)
	return ep, nil
}

// Lookup returns the endpoint recorded for id, recreating its netns and veth
// if they are missing (after a host reboot, say). It returns an
// errdefs.ErrNotFound error if id was never set up.
func (m *Manager) Lookup(ctx context.Context, id string) (*Endpoint, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	unlock := m.lockID(id)
	defer unlock()
	rec, err := m.readRecord(id)
	if err != nil {
		return nil, fmt.Errorf("network: lookup %s: %w", id, err)
	}
	return m.ensure(ctx, rec)
}

// Teardown removes id's veth, netns mount and file, and allocation record.
// It is idempotent: tearing down an unknown id succeeds.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	unlock := m.lockID(id)
	defer unlock()
	var ep *Endpoint
	rec, err := m.readRecord(id)
	switch {
	case err == nil:
		ep = m.endpoint(rec)
	case errors.Is(err, errdefs.ErrNotFound):
		// No record: still sweep anything a crashed Setup may have left.
		ep = &Endpoint{ID: id, NetNS: m.netnsPath(id), HostIf: hostIfName(id)}
	default:
		return fmt.Errorf("network: teardown %s: %w", id, err)
	}
	if err := clearEgress(ep); err != nil {
		return fmt.Errorf("network: teardown %s: %w", id, err)
	}
	if err := m.unplumb(ep); err != nil {
		return fmt.Errorf("network: teardown %s: %w", id, err)
	}
	if err := m.removeRecord(id); err != nil {
		return fmt.Errorf("network: teardown %s: %w", id, err)
	}
	m.logger(ctx).Debug("network: endpoint down", "id", id)
	return nil
}

// List returns the ids that hold an allocation, sorted, so the daemon can
// garbage-collect endpoints of sandboxes it no longer knows.
func (m *Manager) List(ctx context.Context) ([]string, error) {
	recs, err := m.readRecords()
	if err != nil {
		return nil, fmt.Errorf("network: list: %w", err)
	}
	ids := make([]string, 0, len(recs))
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	return ids, nil
}

// ensure makes the derived state (netns, veth, addresses, routes) match rec
// and returns its endpoint.
func (m *Manager) ensure(ctx context.Context, rec *record) (*Endpoint, error) {
	ep := m.endpoint(rec)
	if err := m.plumb(ep); err != nil {
		return nil, fmt.Errorf("network: restore %s: %w", rec.ID, err)
	}
	return ep, nil
}

func (m *Manager) endpoint(r *record) *Endpoint {
	return &Endpoint{
		ID:        r.ID,
		NetNS:     m.netnsPath(r.ID),
		HostIf:    r.HostIf,
		HostIP:    r.HostIP,
		SandboxIP: r.SandboxIP,
		PrefixLen: r.PrefixLen,
	}
}

func (m *Manager) logger(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok && l != nil {
		return l
	}
	return m.log
}

// loggerKey lets callers attach a request-scoped logger with ContextWithLogger.
type loggerKey struct{}

// ContextWithLogger returns ctx carrying l for this package's log lines.
func ContextWithLogger(ctx context.Context, l *slog.Logger) context.Context {
	return context.WithValue(ctx, loggerKey{}, l)
}

// lockID takes the per-id lock and returns its release. Endpoint work is
// short and local, so it waits without a deadline.
func (m *Manager) lockID(id string) func() {
	unlock, _ := m.locks.Lock(context.Background(), id) // cannot fail: Background never ends
	return unlock
}

// validID keeps ids safe as file names under StateDir and the netns dir:
// 1–128 of [A-Za-z0-9_.-], not starting with '.', '-' or '_'.
func validID(id string) error {
	ok := len(id) > 0 && len(id) <= 128
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '_' || c == '.' || c == '-')
	}
	if !ok {
		return fmt.Errorf("network: sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	return nil
}

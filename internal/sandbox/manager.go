// Package sandbox is the lifecycle core: it owns the state machine of every
// sandbox and snapshot and is the only writer of their records.
//
// A sandbox's states and their transitions are in status.go (the one place
// a status changes); its in-memory state and the lock order in box.go; the
// idle/TTL reaper in reaper.go; snapshots, captures, forks and diffs in
// snapshots.go, capture.go, memsnap.go and fork.go, over the lifecycle core
// of sandboxes.go and boot.go. Booting composes the seams in a fixed
// order — storage (overlay rootfs), network (netns), runtime driver (agent as
// PID 1), then waits for the agent — with a cleanup stack, so a failed boot
// leaves nothing behind. The seams it calls are declared in deps.go
// (Storage, Network), runtime.Driver and Egress; sandboxtest fakes them
// all, so the package's tests run without root. The manager knows nothing
// of HTTP; internal/api translates its typed errors. Nor does it know
// metrics or tracing: timed operations and boot phases go to the Observer
// of observe.go, and resource use (stats.go) comes from the driver's
// runtime.Meter, the network's counters and the storage's usage.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/google/go-containerregistry/pkg/authn"
)

// ImageSource resolves an image reference to unpacked layers for one
// workspace (its own local images first, then registries), and loads
// image archives (a capture with docker_image exports one from inside a
// sandbox). The caller releases each image once its layers are recorded
// in a snapshot.
type ImageSource interface {
	Resolve(ctx context.Context, workspaceID, ref string, auth authn.Authenticator, progress func(image.Progress)) (*image.Image, error)
	LoadReader(ctx context.Context, workspaceID string, r io.Reader, name string) ([]*image.Image, error)
}

// Credentials supplies pull credentials for snapshots that name a
// registry_id (internal/registry implements it). It returns a FieldError on
// registry_id for an unknown registry or one that does not host ref.
type Credentials interface {
	PullAuth(ctx context.Context, workspaceID, registryID, ref string) (authn.Authenticator, error)
}

// Config holds the manager's dependencies and policy knobs.
type Config struct {
	Store   store.Store
	Images  ImageSource
	Storage Storage
	Network Network
	// Drivers are the runtimes sandboxes run on, the default first
	// (runtimes.go); a create may name another.
	Drivers []runtime.Driver
	// AgentBinary is the host path of the cubicle binary run as PID 1.
	AgentBinary string
	// AgentPort is the port the agent listens on at the sandbox's address
	// (default agent.Port); tests of the manager move it.
	AgentPort int
	Limits    LimitPolicy
	Logger    *slog.Logger
	// Credentials resolves registry_id for snapshot builds; nil refuses
	// every registry_id.
	Credentials Credentials
	// Egress enforces proxy_config (egress.go); nil runs without an egress
	// proxy and refuses sandboxes that set one.
	Egress Egress
	// Mounts serves mount_config (datamounts.go); nil runs without data
	// mounts and refuses sandboxes that ask for them.
	Mounts DataMounts
	// ReapInterval is how often idle and delete-after-stop TTLs are
	// checked (default 10 s). TTLs fire within one interval of their due time.
	ReapInterval time.Duration
	// TTLGranularity is the unit idle_ttl_seconds and
	// delete_after_stop_seconds must be a multiple of: 60 s, as the protocol
	// says. Tests lower it (e.g. to 1 s) to exercise TTLs quickly.
	TTLGranularity time.Duration
	// Observer sees create, start, stop, capture and fork with their
	// phases (observe.go); nil observes nothing.
	Observer Observer
	// Faults are the crash points of crash-consistency tests (nil: none).
	Faults *fault.Injector
	// Recorder receives lifecycle events for the audit record; nil
	// records nothing.
	Recorder Recorder
	// BuildDir is where Dockerfile builds unpack their contexts (default
	// the system's temporary directory).
	BuildDir string
	// BuildCacheBytes is the step cache each workspace keeps (default
	// DefaultBuildCacheBytes); past it, the least recently used results
	// no snapshot stacks are pruned after each build (layers a snapshot
	// stacks do not count).
	BuildCacheBytes int64
	// OnDemandBuiltins are built-in snapshots made at their first use
	// (a create naming one that no record has yet), not at start, by
	// name (the docker blueprint).
	OnDemandBuiltins map[string]BuiltinSource
	// Capacity bounds concurrent boots and refuses instances the host
	// cannot hold (capacity.go); the zero value runs DefaultMaxBoots()
	// at once and checks neither memory nor store space.
	Capacity HostCapacity
}

// LimitPolicy holds defaults and maxima for sandbox resources.
type LimitPolicy struct {
	DefaultVCPUs, MaxVCPUs       int64
	DefaultMemBytes, MaxMemBytes int64
	DefaultFSBytes, MaxFSBytes   int64
	PidsMax                      int64
	DefaultIdleTTLSeconds        int64
	DefaultDeleteAfterStop       int64
	// BootTimeout bounds one boot (rootfs, network, driver, agent ready).
	BootTimeout time.Duration
}

// DefaultLimits are used for unset LimitPolicy fields.
var DefaultLimits = LimitPolicy{
	DefaultVCPUs: 2, MaxVCPUs: 16,
	DefaultMemBytes: 1 << 30, MaxMemBytes: 64 << 30,
	DefaultFSBytes: 10 << 30, MaxFSBytes: 1 << 40,
	PidsMax:                4096,
	DefaultIdleTTLSeconds:  600,
	DefaultDeleteAfterStop: 14 * 24 * 3600,
	BootTimeout:            60 * time.Second,
}

// Manager runs the lifecycle of sandboxes and snapshots.
type Manager struct {
	cfg Config
	log *slog.Logger
	rt  runtimes

	// quota checks and records claims on workspace quotas (quota.go).
	quota *quotaGate

	// mu guards boxes and every box's fields (lock order: box.go).
	mu     sync.Mutex
	boxes  map[string]*box           // per sandbox id
	builds map[string]*buildProgress // per snapshot id, while building
	// builtinMu makes EnsureBuiltin's look-then-build one step, so two
	// first uses start one build. It is taken before mu.
	builtinMu sync.Mutex
	// transient are ids in use now without a record of their own —
	// Dockerfile build steps' runtime ids, captures' snapshot ids before
	// the snapshot is recorded — which Leftovers must not take for
	// leftovers.
	transient map[string]bool
	// buildLogs are Dockerfile builds' step logs (build.go).
	buildLogs buildLogs
	// buildGate is held shared by every Dockerfile build and exclusively
	// by the step cache's pruning, so no build loses a layer it took
	// from the cache before recording it.
	buildGate sync.RWMutex
	// conns are the open dataplane Conns, re-checked when access changes
	// (access.go).
	conns map[*Conn]struct{}
	// reauth are the OnReauthorize hooks.
	reauth []func(context.Context)
	// pool holds the warm pools' instances (pool.go).
	pool *pools
	// gate admits boots within the host's capacity (capacity.go).
	gate *bootGate

	// Shutdown: life ends at Close, which then waits for bg, every
	// goroutine the manager started (reaper, watchers, builds, boots).
	// wakeR/wakeW is a pipe whose write end Close closes, waking watchers
	// blocked in poll(2).
	life         context.Context
	endLife      context.CancelFunc
	closeOnce    sync.Once
	wakeR, wakeW *os.File
	bg           sync.WaitGroup
}

// New returns a Manager. Call Recover once before serving, and Close
// before closing the store.
func New(cfg Config) (*Manager, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Limits == (LimitPolicy{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = 10 * time.Second
	}
	if cfg.TTLGranularity <= 0 {
		cfg.TTLGranularity = time.Minute
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	if cfg.Recorder == nil {
		cfg.Recorder = nopRecorder{}
	}
	if cfg.AgentPort == 0 {
		cfg.AgentPort = agent.Port
	}
	if cfg.BuildDir == "" {
		cfg.BuildDir = os.TempDir()
	}
	if cfg.BuildCacheBytes <= 0 {
		cfg.BuildCacheBytes = DefaultBuildCacheBytes
	}
	rt, err := newRuntimes(cfg.Drivers)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	life, end := context.WithCancel(context.Background())
	return &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		rt:        rt,
		quota:     newQuotaGate(cfg.Store),
		boxes:     map[string]*box{},
		builds:    map[string]*buildProgress{},
		transient: map[string]bool{},
		conns:     map[*Conn]struct{}{},
		pool:      newPools(),
		gate:      newBootGate(cfg.Capacity),
		life:      life, endLife: end,
		wakeR: r, wakeW: w,
	}, nil
}

// goBG runs fn as a goroutine Close waits for.
func (m *Manager) goBG(fn func()) {
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		fn()
	}()
}

// Close ends the manager's goroutines — the reaper (after a last activity
// flush), process watchers, snapshot builds (left building, for Recover
// to resume) — and waits for them and for boots in flight (bounded by
// BootTimeout). Sandboxes keep running. Close the store only after it.
func (m *Manager) Close() {
	m.closeOnce.Do(func() {
		m.endLife()
		m.wakeW.Close()
	})
	m.bg.Wait()
	m.wakeR.Close()
}

// closing reports whether Close has begun.
func (m *Manager) closing() bool { return m.life.Err() != nil }

// runtimeID is the fixed-length (32 hex) id drivers use for a sandbox.
func runtimeID(id string) string { return strings.ReplaceAll(id, "-", "") }

// agentClient returns a client for the agent of sandbox rid on driver d,
// holding token: through the driver's own transport where it has one
// (runtime.AgentDialer), else TCP to the agent port on ip.
func (m *Manager) agentClient(d runtime.Driver, rid string, ip netip.Addr, token string) *agent.Client {
	return agent.ClientFor(d, rid, net.JoinHostPort(ip.String(), strconv.Itoa(m.cfg.AgentPort)), token)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func principalOf(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, fmt.Errorf("no principal in context")
	}
	return p, nil
}

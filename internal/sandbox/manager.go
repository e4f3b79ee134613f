// Package sandbox is the lifecycle core: it owns the state machine of every
// sandbox and snapshot and is the only writer of their records.
//
// A sandbox moves provisioning → ready ⇄ stopped, or provisioning → failed;
// deletion removes it from any state. Booting composes the seams in a fixed
// order — storage (overlay rootfs), network (netns), runtime driver (agent as
// PID 1), then waits for the agent — with a cleanup stack, so a failed boot
// leaves nothing behind. The manager knows nothing of HTTP; internal/api
// translates its typed errors.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/google/go-containerregistry/pkg/authn"
)

// ImageSource resolves an image reference to unpacked layers for one
// workspace (its own local images first, then registries). The caller
// releases the image once its layers are recorded in a snapshot.
type ImageSource interface {
	Resolve(ctx context.Context, workspaceID, ref string, auth authn.Authenticator, progress func(image.Progress)) (*image.Image, error)
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
	Storage *storage.Overlays
	Network *network.Manager
	Driver  runtime.Driver
	// AgentBinary is the host path of the cubicle binary run as PID 1.
	AgentBinary string
	Limits      LimitPolicy
	Logger      *slog.Logger
	// Credentials resolves registry_id for snapshot builds; nil refuses
	// every registry_id.
	Credentials Credentials
	// Egress enforces proxy_config (egress.go); nil runs without an egress
	// proxy and refuses sandboxes that set one.
	Egress Egress
	// ReapInterval is how often idle and delete-after-stop TTLs are
	// checked (default 10 s). TTLs fire within one interval of their due time.
	ReapInterval time.Duration
	// TTLGranularity is the unit idle_ttl_seconds and
	// delete_after_stop_seconds must be a multiple of: 60 s, as the protocol
	// says. Tests lower it (e.g. to 1 s) to exercise TTLs quickly.
	TTLGranularity time.Duration
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

	mu     sync.Mutex
	locks  map[string]*sync.Mutex    // per sandbox id: serialises lifecycle transitions
	agents map[string]*agent.Client  // per sandbox id, while running
	gone   map[string]chan struct{}  // per sandbox id, closed when its instance goes
	acts   map[string]*activity      // per sandbox id: idle-TTL bookkeeping (activity.go)
	builds map[string]*buildProgress // per snapshot id, while building
	bg     sync.WaitGroup
}

// New returns a Manager. Call Recover once before serving.
func New(cfg Config) *Manager {
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
	return &Manager{
		cfg:    cfg,
		log:    cfg.Logger,
		locks:  map[string]*sync.Mutex{},
		agents: map[string]*agent.Client{},
		gone:   map[string]chan struct{}{},
		acts:   map[string]*activity{},
		builds: map[string]*buildProgress{},
	}
}

// Runtime is the name of the driver sandboxes run on.
func (m *Manager) Runtime() string { return m.cfg.Driver.Name() }

// Wait blocks until background work (snapshot builds, async boots) ends.
func (m *Manager) Wait() { m.bg.Wait() }

func (m *Manager) lock(id string) func() {
	m.mu.Lock()
	l, ok := m.locks[id]
	if !ok {
		l = &sync.Mutex{}
		m.locks[id] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// setAgent records the agent client of sandbox id's running instance, or
// with nil that the instance is gone, which ends every stream relayed to it.
func (m *Manager) setAgent(id string, c *agent.Client) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch := m.gone[id]; ch != nil {
		close(ch)
		delete(m.gone, id)
	}
	if old := m.agents[id]; old != nil {
		old.Close()
	}
	if c == nil {
		delete(m.agents, id)
		return
	}
	m.agents[id] = c
	m.gone[id] = make(chan struct{})
}

// instance returns the agent client of sandbox id's running instance and a
// channel closed when that instance goes, or nil.
func (m *Manager) instance(id string) (*agent.Client, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.agents[id], m.gone[id]
}

// runtimeID is the fixed-length (32 hex) id drivers use for a sandbox.
func runtimeID(id string) string { return strings.ReplaceAll(id, "-", "") }

func agentAddr(ip netip.Addr) string {
	return net.JoinHostPort(ip.String(), strconv.Itoa(agent.Port))
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

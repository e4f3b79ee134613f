package sandbox

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: the
// manager's Close must end everything it started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const workspace = "ws1"

var (
	admin  = auth.Principal{WorkspaceID: workspace, User: "alice", Role: store.RoleAdmin}
	member = auth.Principal{WorkspaceID: workspace, User: "bob", Role: store.RoleMember}
	other  = auth.Principal{WorkspaceID: workspace, User: "carol", Role: store.RoleMember}
)

// env is a manager over the sandboxtest fakes and a real SQLite store.
type env struct {
	m       *Manager
	st      *store.SQLite
	storage *sandboxtest.Storage
	net     *sandboxtest.Network
	driver  *sandboxtest.Driver
	snap    *store.Snapshot // the workspace's ready "default" snapshot
}

type envOption func(*Config)

func newEnv(t *testing.T, opts ...envOption) *env {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.EnsureWorkspace(ctx, store.Workspace{ID: workspace, Name: "ws", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "layer0")
	if err := os.MkdirAll(layer, 0o755); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	sn := &store.Snapshot{ID: "snap-default", WorkspaceID: workspace, CreatedBy: "alice", Name: "default",
		Status: protocol.SnapshotReady, Layers: []string{layer}, FSCapacityBytes: 1 << 30, CreatedAt: now, UpdatedAt: now}
	if err := st.CreateSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	// The workspace's shared snapshot: snapshots are private until shared.
	if err := st.PutShare(ctx, &store.Share{ID: "share-default", WorkspaceID: workspace, ResourceKind: store.ShareSnapshot,
		ResourceID: sn.ID, Grantee: store.ShareWorkspace, Access: "use", CreatedBy: "alice", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	drv, err := sandboxtest.NewDriver()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, storage: sandboxtest.NewStorage(filepath.Join(dir, "storage")), net: sandboxtest.NewNetwork(), driver: drv, snap: sn}
	cfg := Config{
		Store: st, Storage: e.storage, Network: e.net, Drivers: []runtime.Driver{drv}, AgentPort: drv.AgentPort,
		Logger:         slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		TTLGranularity: time.Second, ReapInterval: time.Hour,
	}
	cfg.Limits = DefaultLimits
	cfg.Limits.BootTimeout = 5 * time.Second
	for _, o := range opts {
		o(&cfg)
	}
	if e.m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.m.Close()
		for _, sb := range e.all(t) {
			drv.Stop(ctx, runtimeID(sb.ID))
		}
		st.Close()
	})
	return e
}

// reopen is a daemon restart: a new manager over the same store, storage,
// network and driver (instances outlive the daemon).
func (e *env) reopen(t *testing.T) {
	t.Helper()
	e.m.Close()
	cfg := e.m.cfg
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	if err := m.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) all(t *testing.T) []*store.Sandbox {
	t.Helper()
	all, err := e.st.AllSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return all
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func as(p auth.Principal) context.Context { return auth.WithPrincipal(context.Background(), p) }

func ptr[T any](v T) *T { return &v }

// create creates and boots a sandbox as p, waiting for it.
func (e *env) create(t *testing.T, p auth.Principal, name string) *store.Sandbox {
	t.Helper()
	sb, err := e.m.CreateSandbox(as(p), protocol.CreateSandboxRequest{Name: name})
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	if sb.Status != protocol.StatusReady {
		t.Fatalf("create %s: status %s (%s)", name, sb.Status, sb.StatusMessage)
	}
	return sb
}

func (e *env) get(t *testing.T, id string) *store.Sandbox {
	t.Helper()
	sb, err := e.st.GetSandboxByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

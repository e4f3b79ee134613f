package api

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/build"
	"github.com/cubicle-dev/cubicle/internal/gateway"
	"github.com/cubicle-dev/cubicle/internal/identity"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/registry"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/secrets"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// The interfaces below are what the handlers call on the services behind
// them, and nothing more: the API is tested against in-package fakes, and a
// service may change whatever the handlers do not use.

// Sandboxes is what the handlers call on the sandbox manager.
type Sandboxes interface {
	CreateSnapshot(ctx context.Context, req protocol.CreateSnapshotRequest) (*sandbox.SnapshotView, error)
	// BuildSnapshot starts a Dockerfile build over the context tar.
	BuildSnapshot(ctx context.Context, req protocol.BuildSnapshotRequest, contextTar io.Reader) (*sandbox.SnapshotView, error)
	BuildLog(ctx context.Context, id string) (*build.Log, error)
	GetSnapshot(ctx context.Context, id string) (*sandbox.SnapshotView, error)
	ListSnapshots(ctx context.Context, o store.ListOptions) ([]*sandbox.SnapshotView, error)
	DeleteSnapshot(ctx context.Context, id string) error
	LayersInUse(ctx context.Context) ([]string, error)

	CreateSandbox(ctx context.Context, req protocol.CreateSandboxRequest) (*store.Sandbox, error)
	GetSandbox(ctx context.Context, name string) (*store.Sandbox, error)
	ListSandboxes(ctx context.Context, o store.ListOptions) ([]*store.Sandbox, error)
	UpdateSandbox(ctx context.Context, name string, req protocol.UpdateSandboxRequest) (*store.Sandbox, error)
	StopSandbox(ctx context.Context, name string) (*store.Sandbox, error)
	StartSandbox(ctx context.Context, name string) (*store.Sandbox, error)
	DeleteSandbox(ctx context.Context, name string) error

	CaptureSnapshot(ctx context.Context, name string, req protocol.CaptureSnapshotRequest) (*sandbox.SnapshotView, error)
	Fork(ctx context.Context, name string, req protocol.ForkRequest) (*sandbox.ForkResult, error)
	ResetSandbox(ctx context.Context, name, snapshotID string) (*store.Sandbox, error)
	Diff(ctx context.Context, a, b string) ([]storage.Change, error)
	Usage(ctx context.Context, sandboxes []*store.Sandbox, snapshots []*store.Snapshot) (map[string]int64, error)

	Dataplane(ctx context.Context, id string, op authz.Op) (*sandbox.Conn, error)
	GrantDataplane(ctx context.Context, workspaceID, id string) (*sandbox.Conn, error)
	StatusMessage(ctx context.Context, id string) string
	Stats(ctx context.Context, name string) (*protocol.SandboxStats, error)
	ListStats(ctx context.Context) ([]protocol.SandboxStats, error)

	Share(ctx context.Context, kind, ref string, req sandbox.ShareRequest) (*store.Share, error)
	ListShares(ctx context.Context, kind, ref string) ([]*store.Share, error)
	Unshare(ctx context.Context, kind, ref, shareID string) error

	Leftovers(ctx context.Context) ([]protocol.Leftover, error)
	CleanLeftovers(ctx context.Context) ([]protocol.Leftover, error)

	// Runtimes lists the runtimes served, the default first.
	Runtimes() []protocol.ServedRuntime
	StorageBackend() string
}

// Authenticator turns an X-Api-Key into the principal a request acts as.
type Authenticator interface {
	Authenticate(ctx context.Context, key string) (auth.Principal, error)
}

// Images is the workspace image store behind /images.
type Images interface {
	LoadReader(ctx context.Context, ws string, r io.Reader, name string) ([]*image.Image, error)
	List(ctx context.Context, ws string) ([]*image.Image, error)
	Usage(ctx context.Context, ws string) (int64, error)
	Remove(ctx context.Context, ws, ref string) error
	GC(ctx context.Context, inUse []string) (image.GCResult, error)
}

// Gateway mints and checks service URLs and download links, and serves
// sandbox services.
type Gateway interface {
	http.Handler
	OwnsHost(host string) bool
	IssueService(ctx context.Context, sb *store.Sandbox, port int, ttl time.Duration, embed []string) (gateway.ServiceLink, error)
	GrantLogin(ctx context.Context, sb *store.Sandbox, port int, access string, embed []string) gateway.LoginLink
	IssueDownload(ctx context.Context, sb *store.Sandbox, path, contentType, disposition string, ttl time.Duration) (gateway.DownloadLink, error)
	VerifyDownload(token string) (gateway.Claims, error)
}

// Registries is the registry credential service behind /registries.
type Registries interface {
	Create(ctx context.Context, req protocol.CreateRegistryRequest) (*store.Registry, error)
	Get(ctx context.Context, name string) (*store.Registry, error)
	List(ctx context.Context, o store.ListOptions) ([]*store.Registry, error)
	Update(ctx context.Context, name string, req protocol.UpdateRegistryRequest) (*store.Registry, error)
	Delete(ctx context.Context, name string) error
}

// Vault holds workspace secrets.
type Vault interface {
	Put(ctx context.Context, workspace, name string, value []byte, membersMayUse bool) (secrets.SecretInfo, error)
	List(ctx context.Context, p auth.Principal) []secrets.SecretInfo
	Delete(ctx context.Context, workspace, name string) error
}

// Identity manages workspaces, users and keys, and reads the access
// audit, for the principal in ctx.
type Identity interface {
	CreateWorkspace(ctx context.Context, req protocol.CreateWorkspaceRequest) (*store.Workspace, error)
	Workspaces(ctx context.Context) ([]*store.Workspace, error)
	Workspace(ctx context.Context, ref string) (*store.Workspace, error)
	DeleteWorkspace(ctx context.Context, ref string) error
	CreateUser(ctx context.Context, req protocol.CreateUserRequest) (*store.User, error)
	Users(ctx context.Context, workspace string) ([]*store.User, error)
	User(ctx context.Context, workspace, id string) (*store.User, error)
	DeleteUser(ctx context.Context, workspace, id string) error
	CreateKey(ctx context.Context, req protocol.CreateKeyRequest) (*identity.NewKey, error)
	Keys(ctx context.Context, workspace string) ([]*store.APIKey, error)
	RevokeKey(ctx context.Context, workspace, id string) error
	WhoAmI(ctx context.Context) (*identity.Me, error)
	Access(ctx context.Context, q store.AccessQuery) ([]store.AccessRecord, error)
}

// EgressLogs reports a sandbox's egress decisions.
type EgressLogs interface {
	Log(id string) proxy.Report
}

var (
	_ Sandboxes     = (*sandbox.Manager)(nil)
	_ Quotas        = (*sandbox.Manager)(nil)
	_ Authenticator = (*auth.Authenticator)(nil)
	_ Images        = (*image.Store)(nil)
	_ Gateway       = (*gateway.Gateway)(nil)
	_ Registries    = (*registry.Service)(nil)
	_ Vault         = (*secrets.Vault)(nil)
	_ EgressLogs    = (*proxy.Service)(nil)
	_ Identity      = (*identity.Service)(nil)
)

// Package store persists Cubicle's control-plane state: workspaces, API keys,
// snapshots and sandboxes.
//
// Store is the seam between the manager and the database: SQLite (pure Go,
// WAL) is the embedded default; a Postgres implementation can sit behind the
// same interface when the control plane spans machines. Every record carries
// the workspace it belongs to and the user who created it.
package store

import (
	"context"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Workspace is a tenant: sandboxes, snapshots and keys belong to one.
type Workspace struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

// Roles of an API key within its workspace.
const (
	RoleAdmin  = "admin"
	RoleMember = "member"
)

// APIKey is a stored key. Only a hash of the secret is kept.
type APIKey struct {
	ID          string
	WorkspaceID string
	User        string
	Role        string
	Hash        string
	CreatedAt   time.Time
}

// Snapshot is a bootable root filesystem: an ordered set of read-only layer
// directories plus the run config that commands inherit.
type Snapshot struct {
	ID              string
	WorkspaceID     string
	CreatedBy       string
	Name            string
	Status          string
	StatusMessage   string
	DockerImage     string
	ImageDigest     string
	RegistryID      string
	FSCapacityBytes int64
	// RunConfig is the image's config with the snapshot's own layered on top.
	RunConfig protocol.RunConfig
	// Layers are absolute paths of read-only layer directories, bottom first.
	Layers    []string
	CreatedAt time.Time
	UpdatedAt time.Time
	// SourceSandboxID is the sandbox a captured snapshot was taken from;
	// its last layer is then its own captured layer.
	SourceSandboxID string
	// ProxyConfig is the egress policy (raw proxy_config) of a captured
	// snapshot's source at capture time, or nil. Sandboxes created from
	// the snapshot (every branch of a fork) inherit it unless their create
	// request gives their own. It may hold opaque values: never echoed.
	ProxyConfig []byte
}

// Sandbox is one isolated machine. Records are written only by the sandbox
// manager.
type Sandbox struct {
	ID                     string
	WorkspaceID            string
	CreatedBy              string
	Name                   string
	Status                 string
	StatusMessage          string
	SnapshotID             string
	Runtime                string
	VCPUs                  int64
	MemBytes               int64
	FSCapacityBytes        int64
	IdleTTLSeconds         int64
	DeleteAfterStopSeconds int64
	RunConfig              *protocol.RunConfig
	// Token authenticates the daemon to the sandbox's agent.
	Token     string
	CreatedAt time.Time
	UpdatedAt time.Time
	StoppedAt *time.Time
	// ProxyConfig is the sandbox's egress proxy config as sent (raw JSON),
	// or nil.
	ProxyConfig []byte
	// LastActiveAt is the last persisted activity (see the manager's idle
	// reaper); it lags the live value by at most one reap interval.
	LastActiveAt *time.Time
}

// Registry holds a workspace's pull credentials for one image registry.
// SealedPassword is the password encrypted by internal/secrets; the
// plaintext is never stored.
type Registry struct {
	ID             string
	WorkspaceID    string
	Name           string
	URL            string
	Username       string
	SealedPassword []byte
	CreatedAt      time.Time
	CreatedBy      string
	UpdatedAt      time.Time
	UpdatedBy      string
}

// Resource kinds a share names.
const (
	ShareSandbox  = "sandbox"
	ShareSnapshot = "snapshot"
)

// ShareWorkspace is the grantee of a share with the whole workspace.
const ShareWorkspace = "*"

// Share grants a user (or, as ShareWorkspace, every user of the workspace)
// access ("read" or "use", see internal/authz) to one sandbox or snapshot.
// There is at most one share per (resource, grantee).
type Share struct {
	ID           string
	WorkspaceID  string
	ResourceKind string
	ResourceID   string
	Grantee      string
	Access       string
	CreatedBy    string
	CreatedAt    time.Time
}

// ListOptions filter and page list queries.
type ListOptions struct {
	NameContains string
	// VisibleTo, when set, keeps only the records that user may see as a
	// member: those it created, those shared with it or with the whole
	// workspace, and (snapshots) those built from an image. It is applied
	// in the query, before paging, so a page of a member's records is full.
	VisibleTo string
	Limit     int
	Offset    int
}

// Store is the persistence interface. Lookups of missing records return
// errors wrapping errdefs.ErrNotFound; unique-name clashes wrap
// errdefs.ErrConflict.
type Store interface {
	EnsureWorkspace(ctx context.Context, w Workspace) error
	PutAPIKey(ctx context.Context, k APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
	CountAPIKeys(ctx context.Context) (int, error)

	CreateSnapshot(ctx context.Context, s *Snapshot) error
	UpdateSnapshot(ctx context.Context, s *Snapshot) error
	GetSnapshot(ctx context.Context, workspaceID, id string) (*Snapshot, error)
	SnapshotByName(ctx context.Context, workspaceID, name string) (*Snapshot, error)
	// ListSnapshots lists without run configs (RunConfig is zero); get a
	// snapshot for its run config.
	ListSnapshots(ctx context.Context, workspaceID string, o ListOptions) ([]*Snapshot, error)
	DeleteSnapshot(ctx context.Context, workspaceID, id string) error
	// SnapshotsWithStatus lists every workspace's snapshots in status.
	SnapshotsWithStatus(ctx context.Context, status string) ([]*Snapshot, error)
	// LayersInUse lists the layer directories any snapshot stacks.
	LayersInUse(ctx context.Context) ([]string, error)

	CreateSandbox(ctx context.Context, s *Sandbox) error
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	GetSandbox(ctx context.Context, workspaceID, name string) (*Sandbox, error)
	GetSandboxByID(ctx context.Context, id string) (*Sandbox, error)
	ListSandboxes(ctx context.Context, workspaceID string, o ListOptions) ([]*Sandbox, error)
	// AllSandboxes lists every workspace's sandboxes (recovery, reaping).
	AllSandboxes(ctx context.Context) ([]*Sandbox, error)
	// CountSandboxesUsingSnapshot counts sandboxes created from snapshot id.
	CountSandboxesUsingSnapshot(ctx context.Context, id string) (int, error)
	// SetSandboxSnapshot re-points sandbox id at snapshot snapshotID (a
	// reset to another snapshot).
	SetSandboxSnapshot(ctx context.Context, id, snapshotID string) error
	DeleteSandbox(ctx context.Context, id string) error
	// SetSandboxActivity persists a sandbox's last activity (never backwards).
	SetSandboxActivity(ctx context.Context, id string, at time.Time) error
	// SetSandboxToken persists the agent token of sandbox id's next (or
	// current) instance; UpdateSandbox never writes the token.
	SetSandboxToken(ctx context.Context, id, token string) error

	// PutShare records sh, or, when the resource already has a share with
	// sh.Grantee, changes that share's access and returns it in sh (its
	// id, creator and creation time are kept).
	PutShare(ctx context.Context, sh *Share) error
	// ListShares lists the shares of one resource, oldest first.
	ListShares(ctx context.Context, kind, resourceID string) ([]*Share, error)
	// DeleteShare removes share id of a resource (ErrNotFound if it has
	// none such) and returns what it was.
	DeleteShare(ctx context.Context, kind, resourceID, id string) (*Share, error)
	// SharedAccess returns the access ("" for none) that user holds on a
	// resource through shares with it or with the whole workspace: the
	// higher of the two.
	SharedAccess(ctx context.Context, kind, resourceID, user string) (string, error)
	// UserInWorkspace reports whether user exists in workspaceID (has a key
	// there): only such users can be granted a share.
	UserInWorkspace(ctx context.Context, workspaceID, user string) (bool, error)

	CreateRegistry(ctx context.Context, r *Registry) error
	UpdateRegistry(ctx context.Context, r *Registry) error
	GetRegistry(ctx context.Context, workspaceID, name string) (*Registry, error)
	GetRegistryByID(ctx context.Context, workspaceID, id string) (*Registry, error)
	ListRegistries(ctx context.Context, workspaceID string, o ListOptions) ([]*Registry, error)
	DeleteRegistry(ctx context.Context, workspaceID, id string) error

	Close() error
}

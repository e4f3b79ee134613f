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

// APIKey is a stored key. Only a hash of the secret is kept; Prefix (the
// key's first KeyPrefixLen characters) names it in logs without revealing
// it, and is empty for keys made before prefixes were kept.
type APIKey struct {
	ID          string
	WorkspaceID string
	// User is the id of the key's user in WorkspaceID.
	User      string
	Role      string
	Hash      string
	Name      string
	Prefix    string
	CreatedAt time.Time
	// ExpiresAt is when the key stops working; nil: never.
	ExpiresAt *time.Time
	// RevokedAt is when the key was revoked; nil: it was not.
	RevokedAt *time.Time
	// InstanceAdmin marks the bootstrap key, which manages workspaces.
	InstanceAdmin bool
}

// KeyPrefixLen is how much of a key its Prefix keeps: "cbk_" and 8 hex
// digits, 32 bits of the 256 — enough to tell keys apart, far too few to
// guess the rest.
const KeyPrefixLen = 12

// User is a person or agent of a workspace; API keys act as a user, and
// records name their creator by user id. Ids are unique within a
// workspace (users from before user records have their old user string
// as id). A deleted user keeps its row (DeletedAt set) so records it
// created still name someone; its keys are revoked.
type User struct {
	ID          string
	WorkspaceID string
	Name        string
	Email       string
	CreatedAt   time.Time
	DeletedAt   *time.Time
}

// AccessRecord is one entry of the access audit: who (workspace, user,
// key prefix) did what (method, route pattern, resource, or an Action such
// as "key.create") when, from where, with what outcome. It never holds a
// key, a secret value, a query value or a request body.
type AccessRecord struct {
	// Seq orders records; it is assigned by the store.
	Seq          int64
	Time         time.Time
	WorkspaceID  string
	UserID       string
	KeyPrefix    string
	Action       string
	Method       string
	Route        string
	ResourceKind string
	Resource     string
	// Sandbox is the sandbox named in the request path (a name on the
	// control plane, an id on the dataplane), if any.
	Sandbox   string
	Status    int
	Remote    string
	RequestID string
}

// AccessQuery selects access records: those after cursor After (a Seq),
// at or after Since, oldest first.
type AccessQuery struct {
	// WorkspaceID "" selects every workspace.
	WorkspaceID string
	// Sandboxes, when set, keeps records naming any of them.
	Sandboxes []string
	User      string
	Since     time.Time
	After     int64
	Limit     int
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
	// StartCmd is a shell command started in the background at every
	// cold boot of a sandbox from the snapshot (a Dockerfile's
	// ENTRYPOINT/CMD); ReadyCmd, when set, must then exit 0 before the
	// sandbox is ready. "" is none.
	StartCmd, ReadyCmd string
	// Tag is the snapshot's Docker-style tag under Name: at most one
	// snapshot of a workspace holds a (Name, Tag), and "" is untagged.
	Tag string
	// Labels are key/value metadata (never nil once read).
	Labels map[string]string
	// Packages maps each package a blueprint installed to its version
	// (nil for other snapshots, and in lists; UpdateSnapshot keeps the
	// stored ones when nil).
	Packages map[string]string
	// Docker is the Docker-inside opt-in sandboxes created from the
	// snapshot inherit (a captured snapshot keeps its source's); set at
	// creation only.
	Docker bool
}

// BuiltinWorkspace holds the instance's built-in snapshots (the default
// computer): every workspace's GetSnapshot and SnapshotByName see them
// beside its own (its own first, by name), and ListSnapshots with
// WithBuiltin lists them. No key belongs to it.
const BuiltinWorkspace = "builtin"

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
	// PreserveMemoryOnStop makes a stop checkpoint the sandbox's memory,
	// which the next start restores.
	PreserveMemoryOnStop bool
	// CPUMillicores is the CPU bandwidth asked at millicore granularity;
	// 0 means VCPUs whole cores. When set, VCPUs is it rounded up.
	CPUMillicores int64
	// Labels are the sandbox's key/value metadata, its snapshot's
	// inherited at create (never nil once read).
	Labels map[string]string
	// Persistent: filesystem writes survive a stop; a sandbox that is not
	// persistent boots afresh from its snapshot on every start.
	Persistent bool
	// Volumes are the persistent volumes mounted into the sandbox, in
	// mount order (never nil once read). CreateSandbox records them with
	// the sandbox; SetSandboxVolumes replaces them; UpdateSandbox leaves
	// them alone.
	Volumes []VolumeAttachment
	// Docker runs the sandbox with what Docker inside needs (see
	// runtime.Spec.Docker); fixed at create.
	Docker bool
	// MountConfig is the sandbox's mount_config (spec §4.5) as sent and
	// validated at create (raw JSON; nil for none). It never changes: the
	// daemon serves the same mounts at every boot.
	MountConfig []byte
}

// MilliCPUs is sb's CPU bandwidth in millicores (1000 = one core).
func (sb *Sandbox) MilliCPUs() int64 {
	if sb.CPUMillicores > 0 {
		return sb.CPUMillicores
	}
	return sb.VCPUs * 1000
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

// ListOptions filter and page list queries. Every filter is applied in
// the query, before paging, so pages are full.
type ListOptions struct {
	NameContains string
	// Name, when set, keeps only the records called exactly that.
	Name string
	// VisibleTo, when set, keeps only the records that user may see as a
	// member: those it created, those shared with it or with the whole
	// workspace, and (snapshots) those built from an image.
	VisibleTo string
	// CreatedBy, when set, keeps the records that user created.
	CreatedBy string
	// WithBuiltin adds BuiltinWorkspace's records (snapshots only).
	WithBuiltin bool
	// Status, when set, keeps the records in that status.
	Status string
	// Labels keep the records that match every selector (sandboxes and
	// snapshots only).
	Labels []LabelSelector
	// SortBy is a column of SortColumns (default created_at); Desc
	// reverses the order. Ties are broken by id, in the same direction.
	SortBy string
	Desc   bool
	// After, when set, starts the page after that record (keyset paging;
	// Offset is then ignored).
	After  *Cursor
	Limit  int
	Offset int
}

// LabelSelector matches a record having label Key (with any value unless
// HasValue, then with exactly Value).
type LabelSelector struct {
	Key, Value string
	HasValue   bool
}

// Cursor is the position of a record in a sorted list: its sort column's
// value (a string, an int64, or nil for NULL) and its id.
type Cursor struct {
	Value any
	ID    string
}

// SortColumns are the columns a list of sandboxes or snapshots may sort by.
var SortColumns = map[string][]string{
	"sandboxes":  {"created_at", "updated_at", "name", "status", "stopped_at", "idle_ttl_seconds", "delete_after_stop_seconds"},
	"snapshots":  {"created_at", "updated_at", "name", "status"},
	"registries": {"created_at"},
}

// Store is the persistence interface. Lookups of missing records return
// errors wrapping errdefs.ErrNotFound; unique-name clashes wrap
// errdefs.ErrConflict.
type Store interface {
	EnsureWorkspace(ctx context.Context, w Workspace) error
	PutAPIKey(ctx context.Context, k APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
	CountAPIKeys(ctx context.Context) (int, error)
	// GetAPIKey returns key id of workspaceID (revoked or not).
	GetAPIKey(ctx context.Context, workspaceID, id string) (*APIKey, error)
	// ListAPIKeys lists workspaceID's keys, of user only when user is set.
	ListAPIKeys(ctx context.Context, workspaceID, user string) ([]*APIKey, error)
	// RevokeAPIKey marks key id revoked at at (once; later calls keep the
	// first time).
	RevokeAPIKey(ctx context.Context, workspaceID, id string, at time.Time) error

	// CreateWorkspace inserts w; a name already used wraps ErrConflict.
	CreateWorkspace(ctx context.Context, w Workspace) error
	// GetWorkspace returns the workspace whose id, else name, is ref.
	GetWorkspace(ctx context.Context, ref string) (*Workspace, error)
	ListWorkspaces(ctx context.Context) ([]*Workspace, error)
	// DeleteWorkspace removes workspace id with its users, keys and
	// registries. While it has sandboxes or snapshots, or holds an
	// instance-admin key, it refuses with ErrConflict.
	DeleteWorkspace(ctx context.Context, id string) error

	CreateUser(ctx context.Context, u *User) error
	// GetUser returns a live (not deleted) user.
	GetUser(ctx context.Context, workspaceID, id string) (*User, error)
	// ListUsers lists workspaceID's live users, oldest first.
	ListUsers(ctx context.Context, workspaceID string) ([]*User, error)
	// DeleteUser marks user id deleted and revokes its keys, at once.
	DeleteUser(ctx context.Context, workspaceID, id string, at time.Time) error

	// AppendAccess stores access records in one transaction.
	AppendAccess(ctx context.Context, recs []AccessRecord) error
	ListAccess(ctx context.Context, q AccessQuery) ([]AccessRecord, error)

	CreateSnapshot(ctx context.Context, s *Snapshot) error
	// UpdateSnapshot records a build's outcome: name, status, docker
	// image, digest, run config, layers, labels and start command.
	UpdateSnapshot(ctx context.Context, s *Snapshot) error
	GetSnapshot(ctx context.Context, workspaceID, id string) (*Snapshot, error)
	// GetSnapshot and SnapshotByName (with tag "" or "latest") also find
	// BuiltinWorkspace's snapshots; by name, workspaceID's own come first,
	// then a ready built-in before a building one.
	// SnapshotByName returns snapshot name:tag of workspaceID; tag "" or
	// "latest" is name:latest, else the newest snapshot called name.
	SnapshotByName(ctx context.Context, workspaceID, name, tag string) (*Snapshot, error)
	// ListSnapshots lists without run configs (RunConfig is zero); get a
	// snapshot for its run config.
	ListSnapshots(ctx context.Context, workspaceID string, o ListOptions) ([]*Snapshot, error)
	DeleteSnapshot(ctx context.Context, workspaceID, id string) error
	// SnapshotsWithStatus lists every workspace's snapshots in status.
	SnapshotsWithStatus(ctx context.Context, status string) ([]*Snapshot, error)
	// LayersInUse lists the layer directories any snapshot stacks.
	LayersInUse(ctx context.Context) ([]string, error)

	// GetBuildCache returns workspaceID's step result under key and marks
	// it used now.
	GetBuildCache(ctx context.Context, workspaceID, key string) (*BuildCacheEntry, error)
	// PutBuildCache records e; an entry already under e's key is kept
	// under a retired key (never matched, pruned like any other), since
	// snapshots may stack its layer.
	PutBuildCache(ctx context.Context, e *BuildCacheEntry) error
	// ListBuildCache lists workspaceID's entries, least recently used first.
	ListBuildCache(ctx context.Context, workspaceID string) ([]*BuildCacheEntry, error)
	// DeleteBuildCache removes workspaceID's entry under key.
	DeleteBuildCache(ctx context.Context, workspaceID, key string) error

	CreateSandbox(ctx context.Context, s *Sandbox) error
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	GetSandbox(ctx context.Context, workspaceID, name string) (*Sandbox, error)
	GetSandboxByID(ctx context.Context, id string) (*Sandbox, error)
	ListSandboxes(ctx context.Context, workspaceID string, o ListOptions) ([]*Sandbox, error)
	// AllSandboxes lists every workspace's sandboxes (recovery, reaping).
	AllSandboxes(ctx context.Context) ([]*Sandbox, error)
	// LayerOwners returns every id a captured layer or memory image may be
	// kept under: all snapshot ids, build-cache layer ids and sandbox ids
	// (a memory-preserving stop's image), of every workspace.
	LayerOwners(ctx context.Context) (map[string]bool, error)
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

	// GetQuota returns workspaceID's quotas (all nil, unlimited, when none
	// were set); an unknown workspace is ErrNotFound.
	GetQuota(ctx context.Context, workspaceID string) (Quota, error)
	// PutQuota replaces workspaceID's quotas.
	PutQuota(ctx context.Context, workspaceID string, q Quota) error
	// WorkspaceUsage measures what workspaceID holds against its quotas.
	WorkspaceUsage(ctx context.Context, workspaceID string) (Usage, error)

	VolumeStore
	// PutPool replaces a snapshot's warm pool; size 0 removes it.
	PutPool(ctx context.Context, p Pool) error
	// ListPools returns every snapshot's warm pool.
	ListPools(ctx context.Context) ([]Pool, error)
	// AddPoolInstance records a pool instance before it is booted, so a
	// restarted daemon finds and tears it down.
	AddPoolInstance(ctx context.Context, i PoolInstance) error
	// DeletePoolInstance forgets a pool instance (claimed or torn down).
	DeletePoolInstance(ctx context.Context, id string) error
	// ListPoolInstances returns the recorded pool instances, oldest first.
	ListPoolInstances(ctx context.Context) ([]PoolInstance, error)

	Close() error
}

// Pool is a snapshot's warm pool: Size pre-booted instances, each
// recycled after MaxAgeSeconds (0: never).
type Pool struct {
	SnapshotID    string
	WorkspaceID   string // the snapshot's
	Size          int64
	MaxAgeSeconds int64
}

// PoolInstance is one pre-booted instance of a pool. Its ID is the sandbox
// id the record claiming it adopts (runtime, storage and network state
// are keyed on it).
type PoolInstance struct {
	ID         string
	SnapshotID string
	CreatedAt  time.Time
}

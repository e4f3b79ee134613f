// Package auth turns an API key into a principal: the workspace, user and
// role the request acts as.
//
// Keys are random 32-byte secrets shown once; only their SHA-256 is stored
// (a slow KDF buys nothing for high-entropy keys and would sit on every
// request's path).
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/google/uuid"
)

// DefaultWorkspace is the workspace created on first start.
const DefaultWorkspace = "default"

// Principal is who a request acts as.
type Principal struct {
	WorkspaceID string
	// User is the id of the user the key belongs to.
	User string
	// Role is the key's role in WorkspaceID (store.RoleAdmin or
	// store.RoleMember).
	Role string
	// KeyID is the key's record id; KeyPrefix names it in logs and audit
	// records without revealing it.
	KeyID     string
	KeyPrefix string
	// InstanceAdmin marks the bootstrap key: it manages workspaces and
	// their first admins, and is also an admin of its own workspace.
	InstanceAdmin bool
}

// IsAdmin reports whether p administers its workspace.
func (p Principal) IsAdmin() bool { return p.Role == store.RoleAdmin }

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal stored by WithPrincipal.
func FromContext(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(Principal)
	return p, ok
}

// Hash returns the stored form of a key.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// NewKey returns a fresh random API key.
func NewKey() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "cbk_" + hex.EncodeToString(b)
}

// Authenticator checks keys against the store.
type Authenticator struct {
	st store.Store
}

// New returns an Authenticator over st.
func New(st store.Store) *Authenticator { return &Authenticator{st: st} }

// Authenticate resolves key to a principal or an error wrapping
// errdefs.ErrUnauthorized.
func (a *Authenticator) Authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" {
		return Principal{}, fmt.Errorf("missing X-Api-Key: %w", errdefs.ErrUnauthorized)
	}
	k, err := a.st.APIKeyByHash(ctx, Hash(key))
	if errdefs.IsNotFound(err) {
		return Principal{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthorized)
	}
	if err != nil {
		return Principal{}, err
	}
	return Principal{WorkspaceID: k.WorkspaceID, User: k.User, Role: k.Role}, nil
}

// Bootstrap prepares a fresh install: if no key exists it creates the default
// workspace and an admin key. The key is bootstrapKey when non-empty, else a
// generated one. It returns the key created ("" when keys already existed).
func Bootstrap(ctx context.Context, st store.Store, bootstrapKey string) (string, error) {
	n, err := st.CountAPIKeys(ctx)
	if err != nil {
		return "", err
	}
	if n > 0 {
		return "", nil
	}
	now := time.Now()
	if err := st.EnsureWorkspace(ctx, store.Workspace{ID: DefaultWorkspace, Name: DefaultWorkspace, CreatedAt: now}); err != nil {
		return "", err
	}
	key := bootstrapKey
	if key == "" {
		key = NewKey()
	}
	err = st.PutAPIKey(ctx, store.APIKey{ID: uuid.NewString(), WorkspaceID: DefaultWorkspace, User: "admin",
		Role: store.RoleAdmin, Hash: Hash(key), CreatedAt: now})
	if errors.Is(err, errdefs.ErrConflict) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store bootstrap key: %w", err)
	}
	return key, nil
}

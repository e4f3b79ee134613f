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
	"strings"
	"sync"
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

// Prefix is the part of key that names it in logs and audit records
// (store.KeyPrefixLen characters), or "" for anything not shaped like a
// key NewKey makes: a bootstrap key chosen by hand, or a stray secret sent
// as a key, may be short enough that a prefix would reveal it.
func Prefix(key string) string {
	if !strings.HasPrefix(key, "cbk_") || len(key) < 4*store.KeyPrefixLen {
		return ""
	}
	return key[:store.KeyPrefixLen]
}

// DefaultCacheTTL is how long a successful key lookup is reused: short
// enough that a revocation in another process (or a raw store edit) takes
// effect within a second; revocations through this process take effect at
// once (Forget).
const DefaultCacheTTL = time.Second

// maxCached bounds the cache; past it the cache starts over.
const maxCached = 10000

// Authenticator checks keys against the store, caching successful
// lookups for at most its TTL (and never past a key's expiry), so the
// request hot path (exec, file calls) costs a SHA-256 and a map lookup.
type Authenticator struct {
	st  store.Store
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	cache map[string]cached // by key hash
}

type cached struct {
	p     Principal
	until time.Time
}

// Option configures an Authenticator.
type Option func(*Authenticator)

// WithCacheTTL sets how long a lookup is reused (≤ 0: not cached).
func WithCacheTTL(d time.Duration) Option { return func(a *Authenticator) { a.ttl = d } }

// New returns an Authenticator over st.
func New(st store.Store, opts ...Option) *Authenticator {
	a := &Authenticator{st: st, ttl: DefaultCacheTTL, now: time.Now, cache: map[string]cached{}}
	for _, o := range opts {
		o(a)
	}
	return a
}

// RejectedError is a key that exists but no longer works (revoked,
// expired): it is unauthorized, and says whose it was so the access audit
// can attribute the attempt.
type RejectedError struct {
	Principal Principal
	Reason    string
}

func (e *RejectedError) Error() string {
	if e.Principal.KeyPrefix == "" {
		return "API key " + e.Reason
	}
	return "API key " + e.Principal.KeyPrefix + "… " + e.Reason
}

// Unwrap makes a RejectedError an ErrUnauthorized.
func (e *RejectedError) Unwrap() error { return errdefs.ErrUnauthorized }

// Authenticate resolves key to a principal or an error wrapping
// errdefs.ErrUnauthorized (a *RejectedError for a revoked or expired key).
func (a *Authenticator) Authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" {
		return Principal{}, fmt.Errorf("missing X-Api-Key: %w", errdefs.ErrUnauthorized)
	}
	h := Hash(key)
	now := a.now()
	a.mu.Lock()
	c, ok := a.cache[h]
	a.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.p, nil
	}
	k, err := a.st.APIKeyByHash(ctx, h)
	if errdefs.IsNotFound(err) {
		return Principal{}, fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthorized)
	}
	if err != nil {
		return Principal{}, err
	}
	p := Principal{WorkspaceID: k.WorkspaceID, User: k.User, Role: k.Role, KeyID: k.ID, KeyPrefix: k.Prefix, InstanceAdmin: k.InstanceAdmin}
	switch {
	case k.RevokedAt != nil:
		return Principal{}, &RejectedError{Principal: p, Reason: "was revoked"}
	case k.ExpiresAt != nil && !now.Before(*k.ExpiresAt):
		return Principal{}, &RejectedError{Principal: p, Reason: "has expired"}
	}
	if a.ttl > 0 {
		until := now.Add(a.ttl)
		if k.ExpiresAt != nil && k.ExpiresAt.Before(until) {
			until = *k.ExpiresAt
		}
		a.mu.Lock()
		if len(a.cache) >= maxCached {
			clear(a.cache)
		}
		a.cache[h] = cached{p: p, until: until}
		a.mu.Unlock()
	}
	return p, nil
}

// Forget drops every cached lookup, so a revocation (of a key, or of a
// user's keys) made through this process takes effect on the next request.
func (a *Authenticator) Forget() {
	a.mu.Lock()
	clear(a.cache)
	a.mu.Unlock()
}

// BootstrapUser is the user of the bootstrap key.
const BootstrapUser = "admin"

// Bootstrap prepares a fresh install: if no key exists it creates the default
// workspace and the instance admin's key (an admin of the default
// workspace, user BootstrapUser). The key is bootstrapKey when non-empty, else a
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
	err = st.PutAPIKey(ctx, store.APIKey{ID: uuid.NewString(), WorkspaceID: DefaultWorkspace, User: BootstrapUser,
		Role: store.RoleAdmin, Hash: Hash(key), Name: "bootstrap", Prefix: Prefix(key), CreatedAt: now, InstanceAdmin: true})
	if errors.Is(err, errdefs.ErrConflict) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("store bootstrap key: %w", err)
	}
	return key, nil
}

package secrets

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Vault holds workspace secrets (the values a proxy rule names as
// {NAME}), sealed with a Box, in one JSON file written atomically. Values
// are write-only through the API: List returns names and times, and only
// the egress proxy calls Secret.
//
// Invariant: the file holds only sealed values; each is bound to
// "workspace-secret/<workspace>/<name>", so a value moved to another name or
// workspace does not open.
//
// Who may use a secret. A sandbox whose proxy rule references a secret can
// send its value to any host the rule matches, so referencing one is as
// good as reading it: it needs the same right as listing it — the
// workspace's admin role, or the secret's members_may_use flag, which an
// admin sets on PUT. MayUse is that one check.
type Vault struct {
	box  *Box
	path string

	mu   sync.Mutex
	data map[string]map[string]sealedSecret // workspace → name → value
}

type sealedSecret struct {
	Sealed        []byte    `json:"sealed"`
	MembersMayUse bool      `json:"members_may_use,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// SecretInfo describes a stored secret without its value.
type SecretInfo struct {
	Name string `json:"name"`
	// MembersMayUse grants every member of the workspace the right to
	// list the secret and reference it in their sandboxes' proxy rules;
	// without it only admins may.
	MembersMayUse bool      `json:"members_may_use"`
	CreatedAt     time.Time `json:"created_at"`
	UpdatedAt     time.Time `json:"updated_at"`
}

func (s sealedSecret) info(name string) SecretInfo {
	return SecretInfo{Name: name, MembersMayUse: s.MembersMayUse, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// MaxSecretBytes bounds one secret value.
const MaxSecretBytes = 64 << 10

// OpenVault loads the vault at path (created on first write) sealed by box.
func OpenVault(box *Box, path string) (*Vault, error) {
	v := &Vault{box: box, path: path, data: map[string]map[string]sealedSecret{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return v, nil
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: read vault: %w", err)
	}
	if err := json.Unmarshal(b, &v.data); err != nil {
		return nil, fmt.Errorf("secrets: parse vault %s: %w", path, err)
	}
	return v, nil
}

func ad(workspace, name string) string { return "workspace-secret/" + workspace + "/" + name }

// Put stores value under name in workspace, replacing any earlier value
// and grant: membersMayUse is the secret's members_may_use flag.
func (v *Vault) Put(ctx context.Context, workspace, name string, value []byte, membersMayUse bool) (SecretInfo, error) {
	if len(value) > MaxSecretBytes {
		return SecretInfo{}, errdefs.Field("value", "must be at most %d bytes", MaxSecretBytes)
	}
	sealed, err := v.box.Seal(value, ad(workspace, name))
	if err != nil {
		return SecretInfo{}, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	now := time.Now().UTC()
	ws := v.data[workspace]
	if ws == nil {
		ws = map[string]sealedSecret{}
		v.data[workspace] = ws
	}
	old, existed := ws[name]
	s := sealedSecret{Sealed: sealed, MembersMayUse: membersMayUse, CreatedAt: now, UpdatedAt: now}
	if existed {
		s.CreatedAt = old.CreatedAt
	}
	ws[name] = s
	if err := v.save(); err != nil {
		if existed {
			ws[name] = old
		} else {
			delete(ws, name)
		}
		return SecretInfo{}, err
	}
	return s.info(name), nil
}

// Delete removes name from workspace; an unknown name is ErrNotFound.
func (v *Vault) Delete(ctx context.Context, workspace, name string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	old, ok := v.data[workspace][name]
	if !ok {
		return fmt.Errorf("secret %s: %w", name, errdefs.ErrNotFound)
	}
	delete(v.data[workspace], name)
	if err := v.save(); err != nil {
		v.data[workspace][name] = old
		return err
	}
	return nil
}

// List returns the secrets of p's workspace that p may use (see MayUse),
// by name, without values.
func (v *Vault) List(ctx context.Context, p auth.Principal) []SecretInfo {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]SecretInfo, 0, len(v.data[p.WorkspaceID]))
	for n, s := range v.data[p.WorkspaceID] {
		if authz.MayUseSecret(p, s.MembersMayUse) {
			out = append(out, s.info(n))
		}
	}
	slices.SortFunc(out, func(a, b SecretInfo) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}

// MayUse returns nil if p may reference secret name of its workspace in a
// proxy rule: admins may reference any name (set or not: values are read
// per request), members only a set secret whose members_may_use is on.
// The refusal reads the same whether or not the secret exists.
func (v *Vault) MayUse(ctx context.Context, p auth.Principal, name string) error {
	v.mu.Lock()
	s, ok := v.data[p.WorkspaceID][name]
	v.mu.Unlock()
	if !authz.MayUseSecret(p, ok && s.MembersMayUse) {
		return fmt.Errorf("workspace secret %s is not shared with members (an admin can PUT it with \"members_may_use\": true): %w", name, errdefs.ErrForbidden)
	}
	return nil
}

// Secret returns the value of name in workspace (ErrNotFound if unset).
// Only the egress proxy calls it.
func (v *Vault) Secret(ctx context.Context, workspace, name string) ([]byte, error) {
	v.mu.Lock()
	s, ok := v.data[workspace][name]
	v.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("secret %s is not set: %w", name, errdefs.ErrNotFound)
	}
	return v.box.Open(s.Sealed, ad(workspace, name))
}

// save writes the vault atomically (temp file, fsync, rename). Callers
// hold mu.
func (v *Vault) save() error {
	b, err := json.Marshal(v.data)
	if err != nil {
		return err
	}
	dir := filepath.Dir(v.path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("secrets: vault dir: %w", err)
	}
	if err := atomicfile.WriteFile(v.path, b, 0o600); err != nil {
		return fmt.Errorf("secrets: write vault: %w", err)
	}
	return nil
}

package auth

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// newStore opens a fresh SQLite store with workspace w.
func newStore(t testing.TB) *store.SQLite {
	t.Helper()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.EnsureWorkspace(ctx, store.Workspace{ID: "w", Name: "w", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return st
}

// addKey stores a fresh member key of user bob in w and returns it.
func addKey(t testing.TB, st store.Store, id string, expires *time.Time) string {
	t.Helper()
	key := NewKey()
	if err := st.PutAPIKey(context.Background(), store.APIKey{ID: id, WorkspaceID: "w", User: "bob", Role: store.RoleMember,
		Hash: Hash(key), Prefix: Prefix(key), CreatedAt: time.Now(), ExpiresAt: expires}); err != nil {
		t.Fatal(err)
	}
	return key
}

// clock is a settable time source.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestAuthenticate(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	clk := &clock{t: time.Now()}
	a := New(st)
	a.now = clk.now
	exp := clk.t.Add(time.Minute)
	key := addKey(t, st, "k1", &exp)
	p, err := a.Authenticate(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	want := Principal{WorkspaceID: "w", User: "bob", Role: store.RoleMember, KeyID: "k1", KeyPrefix: key[:12]}
	if p != want {
		t.Fatalf("principal %+v, want %+v", p, want)
	}
	for name, k := range map[string]string{"empty": "", "unknown": NewKey()} {
		if _, err := a.Authenticate(ctx, k); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("%s key: %v, want unauthorized", name, err)
		}
	}
	// Expiry holds even for a cached lookup: the cache never outlives it.
	clk.t = exp
	_, err = a.Authenticate(ctx, key)
	var rej *RejectedError
	if !errors.As(err, &rej) || !errors.Is(err, errdefs.ErrUnauthorized) || rej.Principal.WorkspaceID != "w" || rej.Reason != "has expired" {
		t.Fatalf("expired key: %v", err)
	}
}

// TestRevocationTakesEffect: a key revoked in this process is refused on
// the next request (Forget); one revoked behind the cache's back (another
// process, a raw store edit) within the cache TTL, one second.
func TestRevocationTakesEffect(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	clk := &clock{t: time.Now()}
	a := New(st)
	a.now = clk.now
	key := addKey(t, st, "k1", nil)
	if _, err := a.Authenticate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeAPIKey(ctx, "w", "k1", clk.t); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authenticate(ctx, key); err != nil {
		t.Fatalf("within the TTL the cached lookup still answers: %v", err)
	}
	clk.t = clk.t.Add(DefaultCacheTTL)
	if _, err := a.Authenticate(ctx, key); !errors.Is(err, errdefs.ErrUnauthorized) {
		t.Fatalf("revoked key one TTL later: %v", err)
	}

	key2 := addKey(t, st, "k2", nil)
	if _, err := a.Authenticate(ctx, key2); err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeAPIKey(ctx, "w", "k2", clk.t); err != nil {
		t.Fatal(err)
	}
	a.Forget()
	_, err := a.Authenticate(ctx, key2)
	var rej *RejectedError
	if !errors.As(err, &rej) || rej.Reason != "was revoked" || rej.Principal.KeyID != "k2" {
		t.Fatalf("revoked and forgotten key: %v", err)
	}
}

func TestBootstrapIsInstanceAdmin(t *testing.T) {
	ctx := context.Background()
	st := newStore(t)
	key, err := Bootstrap(ctx, st, "")
	if err != nil || key == "" {
		t.Fatalf("bootstrap: %q %v", key, err)
	}
	p, err := New(st).Authenticate(ctx, key)
	if err != nil || !p.InstanceAdmin || !p.IsAdmin() || p.WorkspaceID != DefaultWorkspace || p.User != BootstrapUser || p.KeyPrefix != key[:12] {
		t.Fatalf("bootstrap principal %+v %v", p, err)
	}
	if again, err := Bootstrap(ctx, st, ""); again != "" || err != nil {
		t.Fatalf("second bootstrap: %q %v", again, err)
	}
}

func TestPrefix(t *testing.T) {
	for _, k := range []string{"short-secret", "cbk_short", "sk-proj-0123456789012345678901234567890123456789012345678901234567"} {
		if got := Prefix(k); got != "" {
			t.Errorf("prefix of %q = %q, want none", k, got)
		}
	}
	if k := NewKey(); Prefix(k) != k[:12] || k[:4] != "cbk_" {
		t.Errorf("prefix of %s = %q", k, Prefix(k))
	}
}

// BenchmarkAuthenticate compares a cached lookup (the hot path: every
// exec and file call) with a store lookup.
func BenchmarkAuthenticate(b *testing.B) {
	ctx := context.Background()
	st := newStore(b)
	key := addKey(b, st, "k1", nil)
	for _, bc := range []struct {
		name string
		ttl  time.Duration
	}{{"cached", DefaultCacheTTL}, {"uncached", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			a := New(st, WithCacheTTL(bc.ttl))
			for b.Loop() {
				if _, err := a.Authenticate(ctx, key); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

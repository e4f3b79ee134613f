package registry

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/secrets"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func newService(t *testing.T) (*Service, *store.SQLite, context.Context) {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, ws := range []string{"w1", "w2"} {
		if err := st.EnsureWorkspace(ctx, store.Workspace{ID: ws, Name: ws, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	box, err := secrets.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	if err != nil {
		t.Fatal(err)
	}
	return New(st, box), st, auth.WithPrincipal(ctx, auth.Principal{WorkspaceID: "w1", User: "alice", Role: store.RoleMember})
}

func TestCreateSealsPasswordAndPullAuthChecksHost(t *testing.T) {
	s, st, ctx := newService(t)
	r, err := s.Create(ctx, protocol.CreateRegistryRequest{Name: "ghcr", URL: "https://ghcr.io", Username: "bot", Password: "s3cret-pw"})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := st.GetRegistry(ctx, "w1", "ghcr")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored.SealedPassword, []byte("s3cret-pw")) {
		t.Fatal("password stored in plaintext")
	}
	a, err := s.PullAuth(ctx, "w1", r.ID, "ghcr.io/org/app:1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := a.Authorization()
	if got := cfg; got.Username != "bot" || got.Password != "s3cret-pw" {
		t.Fatalf("credentials %+v", got)
	}
	var fe *errdefs.FieldError
	if _, err := s.PullAuth(ctx, "w1", r.ID, "docker.io/library/busybox"); !errors.As(err, &fe) || fe.Field != "registry_id" {
		t.Fatalf("image on another host: %v, want a registry_id field error", err)
	}
	if _, err := s.PullAuth(ctx, "w2", r.ID, "ghcr.io/org/app:1"); !errors.As(err, &fe) {
		t.Fatalf("another workspace's registry: %v, want a field error", err)
	}
}

func TestHostCanonicalisesDockerHub(t *testing.T) {
	for in, want := range map[string]string{
		"docker.io": "index.docker.io", "https://index.docker.io/v1/": "index.docker.io",
		"localhost:5000": "localhost:5000", "http://127.0.0.1:8080/": "127.0.0.1:8080",
	} {
		if got, err := Host(in); err != nil || got != want {
			t.Errorf("Host(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ftp://x", "https://user:pw@host"} {
		if _, err := Host(bad); err == nil {
			t.Errorf("Host(%q) accepted", bad)
		}
	}
}

func TestUpdateRenameConflictAndValidation(t *testing.T) {
	s, _, ctx := newService(t)
	for _, n := range []string{"a", "b"} {
		if _, err := s.Create(ctx, protocol.CreateRegistryRequest{Name: n, URL: "reg.example.com", Username: "u", Password: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	b := "b"
	if _, err := s.Update(ctx, "a", protocol.UpdateRegistryRequest{Name: &b}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("rename onto an existing name: %v, want conflict", err)
	}
	empty := ""
	if _, err := s.Update(ctx, "a", protocol.UpdateRegistryRequest{Password: &empty}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("empty password: %v, want invalid", err)
	}
	if _, err := s.Create(ctx, protocol.CreateRegistryRequest{Name: "c", URL: "reg.example.com", Username: "u"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("missing password: %v, want invalid", err)
	}
	// registry_id takes an id or a name: a name never looks like an id.
	var fe *errdefs.FieldError
	asID := "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
	if _, err := s.Create(ctx, protocol.CreateRegistryRequest{Name: asID, URL: "reg.example.com", Username: "u", Password: "p"}); !errors.As(err, &fe) || fe.Field != "name" {
		t.Fatalf("UUID name on create: %v, want a name field error", err)
	}
	if _, err := s.Update(ctx, "a", protocol.UpdateRegistryRequest{Name: &asID}); !errors.As(err, &fe) || fe.Field != "name" {
		t.Fatalf("rename to a UUID: %v, want a name field error", err)
	}
	pw, c := "new", "c"
	r, err := s.Update(ctx, "a", protocol.UpdateRegistryRequest{Name: &c, Password: &pw})
	if err != nil || r.Name != "c" || r.UpdatedBy != "alice" {
		t.Fatalf("update: %+v %v", r, err)
	}
	a, err := s.PullAuth(ctx, "w1", "c", "reg.example.com/x:1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := a.Authorization()
	if cfg.Password != "new" {
		t.Fatalf("password after update %q", cfg.Password)
	}
	if err := s.Delete(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "c"); !errdefs.IsNotFound(err) {
		t.Fatalf("get after delete: %v", err)
	}
}

// Package registry keeps each workspace's private image registry
// credentials (spec §3.4) and hands them to snapshot builds.
//
// Passwords are sealed with internal/secrets before they reach the store,
// bound to the registry's id, and are opened only to build an
// authn.Authenticator for a pull from that registry's own host: a snapshot
// cannot send a workspace's credentials to some other registry.
package registry

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/uuid"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/secrets"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Service manages registry records. Records are written only here.
type Service struct {
	st  store.Store
	box *secrets.Box
}

// New returns a Service storing records in st and sealing passwords with box.
func New(st store.Store, box *secrets.Box) *Service { return &Service{st: st, box: box} }

// maxField bounds url, username and password lengths.
const maxField = 4096

// JSON returns the wire form of r (never the password).
func JSON(r *store.Registry) protocol.Registry {
	return protocol.Registry{ID: r.ID, Name: r.Name, URL: r.URL, CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy,
		UpdatedAt: r.UpdatedAt, UpdatedBy: r.UpdatedBy}
}

func principal(ctx context.Context) (auth.Principal, error) {
	p, ok := auth.FromContext(ctx)
	if !ok {
		return auth.Principal{}, fmt.Errorf("no principal in context")
	}
	return p, nil
}

// Host returns the canonical registry host of a registry URL such as
// "https://ghcr.io", "registry.example.com:5000" or "docker.io", as
// go-containerregistry names it (Docker Hub is "index.docker.io").
func Host(raw string) (string, error) {
	u := strings.TrimSpace(raw)
	if !strings.Contains(u, "://") {
		u = "https://" + u
	}
	pu, err := url.Parse(u)
	if err != nil || pu.Host == "" || pu.User != nil || (pu.Scheme != "http" && pu.Scheme != "https") {
		return "", errdefs.Field("url", "must be a registry host or an http(s) URL without credentials")
	}
	reg, err := name.NewRegistry(pu.Host, name.WeakValidation)
	if err != nil {
		return "", errdefs.Field("url", "invalid registry host %q", pu.Host)
	}
	return reg.RegistryStr(), nil
}

// imageHost returns the canonical registry host of an image reference.
func imageHost(ref string) (string, error) {
	r, err := name.ParseReference(ref, name.WeakValidation)
	if err != nil {
		return "", errdefs.Field("docker_image", "invalid image reference: %v", err)
	}
	return r.Context().RegistryStr(), nil
}

func validate(r *store.Registry, password string) error {
	if err := store.ValidateName("name", r.Name); err != nil {
		return err
	}
	if _, err := Host(r.URL); err != nil {
		return err
	}
	for _, f := range []struct{ field, v string }{{"url", r.URL}, {"username", r.Username}, {"password", password}} {
		if f.v == "" {
			return errdefs.Field(f.field, "is required")
		}
		if len(f.v) > maxField {
			return errdefs.Field(f.field, "must be at most %d bytes", maxField)
		}
	}
	return nil
}

// Create stores a new registry for the caller's workspace.
func (s *Service) Create(ctx context.Context, req protocol.CreateRegistryRequest) (*store.Registry, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	r := &store.Registry{ID: uuid.NewString(), WorkspaceID: p.WorkspaceID, Name: req.Name, URL: req.URL, Username: req.Username,
		CreatedAt: now, CreatedBy: p.User, UpdatedAt: now, UpdatedBy: p.User}
	if err := validate(r, req.Password); err != nil {
		return nil, err
	}
	if r.SealedPassword, err = s.box.Seal([]byte(req.Password), r.ID); err != nil {
		return nil, err
	}
	if err := s.st.CreateRegistry(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// Get returns the caller's workspace's registry called name.
func (s *Service) Get(ctx context.Context, name string) (*store.Registry, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	return s.st.GetRegistry(ctx, p.WorkspaceID, name)
}

// List lists the caller's workspace's registries.
func (s *Service) List(ctx context.Context, o store.ListOptions) ([]*store.Registry, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	return s.st.ListRegistries(ctx, p.WorkspaceID, o)
}

// Update changes the fields req sets; a new password is sealed afresh.
func (s *Service) Update(ctx context.Context, name string, req protocol.UpdateRegistryRequest) (*store.Registry, error) {
	p, err := principal(ctx)
	if err != nil {
		return nil, err
	}
	r, err := s.st.GetRegistry(ctx, p.WorkspaceID, name)
	if err != nil {
		return nil, err
	}
	if req.Name == nil && req.URL == nil && req.Username == nil && req.Password == nil {
		return r, nil
	}
	set := func(dst *string, v *string) {
		if v != nil {
			*dst = *v
		}
	}
	set(&r.Name, req.Name)
	set(&r.URL, req.URL)
	set(&r.Username, req.Username)
	password := "unchanged"
	if req.Password != nil {
		password = *req.Password
	}
	if err := validate(r, password); err != nil {
		return nil, err
	}
	if req.Password != nil {
		if r.SealedPassword, err = s.box.Seal([]byte(*req.Password), r.ID); err != nil {
			return nil, err
		}
	}
	r.UpdatedAt, r.UpdatedBy = time.Now().UTC(), p.User
	if err := s.st.UpdateRegistry(ctx, r); err != nil {
		return nil, err
	}
	return r, nil
}

// Delete removes the registry called name. Snapshots already built from it
// keep working (their layers are local); building new ones fails.
func (s *Service) Delete(ctx context.Context, name string) error {
	p, err := principal(ctx)
	if err != nil {
		return err
	}
	r, err := s.st.GetRegistry(ctx, p.WorkspaceID, name)
	if err != nil {
		return err
	}
	return s.st.DeleteRegistry(ctx, p.WorkspaceID, r.ID)
}

// PullAuth returns basic-auth credentials of registry id in workspaceID
// for pulling ref. It refuses (a FieldError on registry_id) an unknown
// registry or an image hosted elsewhere than the registry's URL. id may
// also be the registry's name.
func (s *Service) PullAuth(ctx context.Context, workspaceID, id, ref string) (authn.Authenticator, error) {
	r, err := s.st.GetRegistryByID(ctx, workspaceID, id)
	if errdefs.IsNotFound(err) {
		r, err = s.st.GetRegistry(ctx, workspaceID, id)
	}
	if errdefs.IsNotFound(err) {
		return nil, errdefs.Field("registry_id", "no registry %q in this workspace", id)
	}
	if err != nil {
		return nil, err
	}
	want, err := Host(r.URL)
	if err != nil {
		return nil, err
	}
	got, err := imageHost(ref)
	if err != nil {
		return nil, err
	}
	if got != want {
		return nil, errdefs.Field("registry_id", "registry %q is for %s, but the image is on %s", r.Name, want, got)
	}
	pw, err := s.box.Open(r.SealedPassword, r.ID)
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", r.Name, err)
	}
	return &authn.Basic{Username: r.Username, Password: string(pw)}, nil
}

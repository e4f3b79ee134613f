package image

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Platform is the only platform sandboxes run; multi-platform indexes are
// narrowed to it.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Resolve returns the image ref names for workspace ws, pulling it only if
// ws does not already have it. ws's own names (its earlier pulls and
// loads) win over the registry, so a loaded image resolves without
// network; another workspace's names and pulls are never consulted. ref
// may also be a bare manifest digest ("sha256:…") of an image ws holds.
//
// auth nil means anonymous. progress, if non-nil, is called from the
// pulling goroutines (serialised) as compressed layer bytes arrive.
// The caller must Release the image once it has recorded its layers.
// Errors wrap errdefs.ErrInvalid (bad ref, or an image over a cap),
// ErrNotFound (no such image or platform), ErrUnauthorized (credentials
// refused) or ErrUnavailable (registry unreachable).
func (s *Store) Resolve(ctx context.Context, ws, ref string, auth authn.Authenticator, progress func(Progress)) (*Image, error) {
	if IsDigest(ref) {
		img, err := s.byDigest(ws, ref)
		if err == nil {
			img, err = s.hold(img)
		}
		if err != nil {
			return nil, fmt.Errorf("resolve image %s: %w", ref, err)
		}
		return img, nil
	}
	r, err := s.parse(ref)
	if err != nil {
		return nil, fmt.Errorf("resolve image: %w", err)
	}
	canon := r.Name()
	if auth == nil {
		auth = authn.Anonymous
	}
	if img, private, err := s.lookup(ws, canon); err == nil {
		if private {
			if err := s.checkAccess(ctx, r, auth, img.Digest); err != nil {
				return nil, fmt.Errorf("resolve image %s: %w", ref, err)
			}
		}
		if img, err = s.hold(img); err != nil {
			return nil, fmt.Errorf("resolve image %s: %w", ref, err)
		}
		return img, nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("resolve image %s: %w", ref, err)
	}
	if d, ok := r.(name.Digest); ok {
		if img, err := s.byDigest(ws, d.DigestStr()); err == nil {
			if img, err = s.hold(img); err == nil {
				img.Ref = canon
				return img, nil
			}
		}
	}
	img, err := s.pull(ctx, ws, r, auth, progress)
	if err != nil {
		return nil, fmt.Errorf("pull image %s: %w", ref, err)
	}
	return img, nil
}

// remoteOptions are the registry options for reaching r with auth.
func (s *Store) remoteOptions(ctx context.Context, r name.Reference, auth authn.Authenticator) []remote.Option {
	var base http.RoundTripper = remote.DefaultTransport
	if s.isInsecure(r.Context().RegistryStr()) {
		base = insecureTransport()
	}
	return []remote.Option{
		remote.WithContext(ctx), remote.WithAuth(auth), remote.WithPlatform(Platform),
		remote.WithTransport(manifestCapTransport{base: base}),
	}
}

// checkAccess asks the registry, with the caller's credentials, for the
// manifest of a privately pulled image before its stored layers are handed
// out: credentials the registry no longer accepts do not keep working
// through the store. The manifest digest must still match.
func (s *Store) checkAccess(ctx context.Context, r name.Reference, auth authn.Authenticator, digest string) error {
	img, err := remote.Image(r, s.remoteOptions(ctx, r, auth)...)
	if err != nil {
		return fmt.Errorf("check access to private image: %w", classify(err))
	}
	got, err := img.Digest()
	if err != nil {
		return fmt.Errorf("check access to private image: %w", classify(err))
	}
	if got.String() != digest {
		return fmt.Errorf("private image moved to %s since it was pulled (%s): remove it from the store to pull again: %w", got, digest, errdefs.ErrConflict)
	}
	return nil
}

// pull fetches r from its registry into workspace ws, reporting the
// pull and the layer bytes it transferred to the store's meter.
func (s *Store) pull(ctx context.Context, ws string, r name.Reference, auth authn.Authenticator, progress func(Progress)) (_ *Image, err error) {
	var transferred int64
	defer func() { s.meter.ImagePull(transferred, err) }()
	progress = func(report func(Progress)) func(Progress) {
		return func(p Progress) {
			transferred = p.Complete
			if report != nil {
				report(p)
			}
		}
	}(progress)
	s.log.Info("image: pulling", "ref", r.Name(), "workspace", ws)
	img, err := remote.Image(r, s.remoteOptions(ctx, r, auth)...)
	if err != nil {
		return nil, classify(err)
	}
	src, err := sourceOf(img)
	if err != nil {
		return nil, classify(err)
	}
	out, err := s.ingest(ctx, src, ingestTarget{ws: ws, refs: []string{r.Name()}, private: auth != authn.Anonymous, fromRegistry: true}, progress)
	if err != nil {
		return nil, classify(err)
	}
	s.log.Info("image: pulled", "ref", r.Name(), "digest", out.Digest, "layers", len(out.Layers))
	return out, nil
}

// canonical returns the store's key for ref: the fully qualified name
// ("index.docker.io/library/busybox:latest").
func (s *Store) canonical(ref string) (string, error) {
	r, err := s.parse(ref)
	if err != nil {
		return "", err
	}
	return r.Name(), nil
}

// parse parses ref, marking loopback and configured insecure registries so
// ggcr talks plain HTTP to them.
func (s *Store) parse(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("parse image ref %q: %w: %w", ref, errdefs.ErrInvalid, err)
	}
	if !s.isInsecure(r.Context().RegistryStr()) {
		return r, nil
	}
	r, err = name.ParseReference(ref, name.Insecure)
	if err != nil {
		return nil, fmt.Errorf("parse image ref %q: %w: %w", ref, errdefs.ErrInvalid, err)
	}
	return r, nil
}

// isInsecure reports whether registry (HOST[:PORT]) is loopback or listed
// by WithInsecureRegistries.
func (s *Store) isInsecure(registry string) bool {
	registry = strings.ToLower(registry)
	host := registry
	if h, _, err := net.SplitHostPort(registry); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if host == "localhost" {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	return s.insecure[registry] || s.insecure[host]
}

// insecureTransport skips TLS verification; ggcr falls back to plain HTTP
// by itself for references parsed with name.Insecure.
func insecureTransport() http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // operator-listed insecure registry
	return t
}

// classify wraps a registry error with the errdefs kind callers act on.
func classify(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	for _, k := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrUnauthorized, errdefs.ErrUnavailable} {
		if errors.Is(err, k) {
			return err
		}
	}
	var te *transport.Error
	if errors.As(err, &te) {
		for _, d := range te.Errors {
			switch d.Code {
			case transport.NameUnknownErrorCode, transport.ManifestUnknownErrorCode, transport.BlobUnknownErrorCode:
				return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return fmt.Errorf("%w: %w", errdefs.ErrUnauthorized, err)
			}
		}
		switch {
		case te.StatusCode == http.StatusNotFound:
			return fmt.Errorf("%w: %w", errdefs.ErrNotFound, err)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return fmt.Errorf("%w: %w", errdefs.ErrUnauthorized, err)
		case te.StatusCode == http.StatusTooManyRequests || te.StatusCode >= 500:
			return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
		}
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return fmt.Errorf("no %s/%s image: %w: %w", Platform.OS, Platform.Architecture, errdefs.ErrNotFound, err)
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return fmt.Errorf("%w: %w", errdefs.ErrUnavailable, err)
	}
	return err
}

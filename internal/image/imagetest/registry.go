// Package imagetest builds OCI images in-process and serves them from a
// real in-process registry, for tests of internal/image and of every
// package (and e2e test) that needs an image without touching the network.
//
// Everything here is deterministic: the same host binaries give the same
// digests, so tests may compare digests across runs.
package imagetest

import (
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// StartRegistry starts go-containerregistry's in-memory registry on
// 127.0.0.1 and returns its "host:port". It is shut down when t ends.
func StartRegistry(t testing.TB) string {
	t.Helper()
	return serve(t, newRegistry())
}

// StartAuthRegistry is StartRegistry requiring HTTP basic auth with
// user/pass on every request; others get 401 with a Basic challenge, as a
// real registry does.
func StartAuthRegistry(t testing.TB, user, pass string) string {
	t.Helper()
	reg := newRegistry()
	return serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="imagetest"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		reg.ServeHTTP(w, r)
	}))
}

func newRegistry() http.Handler {
	return registry.New(registry.Logger(log.New(io.Discard, "", 0)))
}

func serve(t testing.TB, h http.Handler) string {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Push uploads img to the registry at host as repoTag ("repo:tag" or
// "repo@…") and returns the full reference "host/repoTag".
func Push(t testing.TB, host, repoTag string, img v1.Image) string {
	t.Helper()
	return PushAuth(t, host, repoTag, img, "", "")
}

// PushAuth is Push with basic-auth credentials (for StartAuthRegistry);
// empty user means anonymous.
func PushAuth(t testing.TB, host, repoTag string, img v1.Image, user, pass string) string {
	t.Helper()
	ref := host + "/" + repoTag
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatalf("imagetest: parse %s: %v", ref, err)
	}
	opts := []remote.Option{}
	if user != "" {
		opts = append(opts, remote.WithAuth(basic(user, pass)))
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("imagetest: push %s: %v", ref, err)
	}
	return ref
}

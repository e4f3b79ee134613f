package image

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
)

// Workspaces the tests act as.
const (
	wsA = "ws-a"
	wsB = "ws-b"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := NewStore(filepath.Join(t.TempDir(), "images"), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// countingRegistry is imagetest.StartRegistry plus a request counter, to
// prove when Resolve does or does not touch the network.
func countingRegistry(t *testing.T) (string, *atomic.Int64) {
	var n atomic.Int64
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://"), &n
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestResolvePullsBusybox(t *testing.T) {
	requireRoot(t)
	host, requests := countingRegistry(t)
	img := imagetest.BusyboxImage(t)
	ref := imagetest.Push(t, host, "base/busybox:1", img)
	s := newStore(t)

	var last Progress
	calls := 0
	got, err := s.Resolve(context.Background(), wsA, ref, nil, func(p Progress) { last = p; calls++ })
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if got.Ref != ref || got.Digest != digestOf(t, img) {
		t.Errorf("got ref %q digest %s, want %q %s", got.Ref, got.Digest, ref, digestOf(t, img))
	}
	if len(got.Layers) != 1 || !filepath.IsAbs(got.Layers[0]) {
		t.Fatalf("Layers = %v, want one absolute dir", got.Layers)
	}
	if calls < 2 || last.Total == 0 || last.Complete != last.Total {
		t.Errorf("progress: %d calls, last %+v; want several, ending complete", calls, last)
	}
	if got.Size < 2<<20 {
		t.Errorf("Size = %d, want at least busybox+bash", got.Size)
	}
	if got.Config.WorkDir != "/" || got.Config.EnvVars["PATH"] != imagetest.DefaultPath {
		t.Errorf("Config = %+v", got.Config)
	}

	root := got.Layers[0]
	want, _ := os.ReadFile(imagetest.BusyboxPath)
	if have, err := os.ReadFile(filepath.Join(root, "bin/busybox")); err != nil || !bytes.Equal(have, want) {
		t.Errorf("bin/busybox differs from host (%v)", err)
	}
	if target, err := os.Readlink(filepath.Join(root, "bin/ls")); err != nil || target != "/bin/busybox" {
		t.Errorf("bin/ls -> %q (%v)", target, err)
	}
	if st := lstat(t, filepath.Join(root, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(root, "home/app")); st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("home/app owner %d:%d, want 1000:1000", st.Uid, st.Gid)
	}

	// Second resolve is served locally.
	before := requests.Load()
	again, err := s.Resolve(context.Background(), wsA, ref, nil, nil)
	if err != nil || again.Digest != got.Digest || requests.Load() != before {
		t.Errorf("second Resolve: %v, digest %s, %d new requests; want local hit", err, again.Digest, requests.Load()-before)
	}
	// So is the bare digest.
	if byDigest, err := s.Resolve(context.Background(), wsA, got.Digest, nil, nil); err != nil || byDigest.Layers[0] != root {
		t.Errorf("Resolve(digest): %v", err)
	}
}

// overlayStack is two layers: the upper whites out a file and a directory
// and makes one directory opaque.
func overlayStack(t *testing.T) v1.Image {
	lower := imagetest.Layer(t,
		imagetest.Dir("a/", 0o755),
		imagetest.File("a/keep", 0o644, "keep"),
		imagetest.File("a/gone", 0o644, "gone"),
		imagetest.Dir("a/subdir/", 0o755),
		imagetest.File("a/subdir/deep", 0o644, "deep"),
		imagetest.Dir("o/", 0o755),
		imagetest.File("o/old", 0o644, "old"),
		imagetest.File("top.txt", 0o644, "top"),
	)
	upper := imagetest.Layer(t,
		imagetest.Dir("a/", 0o755),
		imagetest.Whiteout("a/gone"),
		imagetest.Whiteout("a/subdir"),
		imagetest.File("a/added", 0o644, "added"),
		imagetest.Dir("o/", 0o755),
		imagetest.Opaque("o"),
		imagetest.File("o/new", 0o644, "new"),
		imagetest.Whiteout("top.txt"),
	)
	return imagetest.Image(t, v1.Config{}, lower, upper)
}

func TestOverlayViewOfWhiteoutsAndOpaqueDirs(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	ref := imagetest.Push(t, host, "test/overlay:1", overlayStack(t))
	s := newStore(t)
	img, err := s.Resolve(context.Background(), wsA, ref, nil, nil)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if len(img.Layers) != 2 {
		t.Fatalf("Layers = %v, want 2", img.Layers)
	}
	mnt := t.TempDir()
	opts := "lowerdir=" + img.Layers[1] + ":" + img.Layers[0] // top first
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts); err != nil {
		t.Fatalf("mount overlay (%s): %v", opts, err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })

	for p, want := range map[string]string{"a/keep": "keep", "a/added": "added", "o/new": "new"} {
		if b, err := os.ReadFile(filepath.Join(mnt, p)); err != nil || string(b) != want {
			t.Errorf("merged %s = %q (%v), want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"a/gone", "a/subdir", "o/old", "top.txt"} {
		if _, err := os.Lstat(filepath.Join(mnt, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("merged %s: err %v, want hidden", p, err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "o"))
	if err != nil || len(ents) != 1 || ents[0].Name() != "new" {
		t.Errorf("merged o/ = %v (%v), want only new", ents, err)
	}
}

func TestResolveZstdLayer(t *testing.T) {
	requireRoot(t)
	data := imagetest.TarBytes(t, imagetest.File("hello.txt", 0o644, "zstd works"))
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	}, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := l.Compressed()
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 4)
	io.ReadFull(rc, head)
	rc.Close()
	if !bytes.Equal(head, zstdMagic) {
		t.Fatalf("layer blob starts %x, want zstd magic", head)
	}
	host := imagetest.StartRegistry(t)
	ref := imagetest.Push(t, host, "test/zstd:1", imagetest.Image(t, v1.Config{}, l))
	img, err := newStore(t).Resolve(context.Background(), wsA, ref, nil, nil)
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(img.Layers[0], "hello.txt")); err != nil || string(b) != "zstd works" {
		t.Errorf("hello.txt = %q (%v)", b, err)
	}
}

func TestResolveErrors(t *testing.T) {
	host := imagetest.StartRegistry(t)
	imagetest.Push(t, host, "test/exists:1", overlayStack(t))
	s := newStore(t)
	ctx := context.Background()
	for _, ref := range []string{host + "/test/missing:1", host + "/test/exists:nope",
		host + "/test/exists@sha256:" + strings.Repeat("0", 64)} {
		if _, err := s.Resolve(ctx, wsA, ref, nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Resolve(%s) = %v, want ErrNotFound", ref, err)
		}
	}
	for _, ref := range []string{"Bad Ref!", "a:b:c", ""} {
		if _, err := s.Resolve(ctx, wsA, ref, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Resolve(%q) = %v, want ErrInvalid", ref, err)
		}
	}
	if _, err := s.Resolve(ctx, wsA, "sha256:"+strings.Repeat("1", 64), nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resolve(unknown digest) = %v, want ErrNotFound", err)
	}
	// Nothing listens on port 1.
	if _, err := s.Resolve(ctx, wsA, "127.0.0.1:1/x/y:z", nil, nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Resolve(dead registry) = %v, want ErrUnavailable", err)
	}
}

func TestResolveWithBasicAuth(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartAuthRegistry(t, "alice", "s3cret")
	ref := imagetest.PushAuth(t, host, "private/app:1", overlayStack(t), "alice", "s3cret")
	ctx := context.Background()
	for _, auth := range []authn.Authenticator{nil, &authn.Basic{Username: "alice", Password: "wrong"}} {
		if _, err := newStore(t).Resolve(ctx, wsA, ref, auth, nil); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("Resolve with %v = %v, want ErrUnauthorized", auth, err)
		}
	}
	img, err := newStore(t).Resolve(ctx, wsA, ref, &authn.Basic{Username: "alice", Password: "s3cret"}, nil)
	if err != nil || len(img.Layers) != 2 {
		t.Fatalf("Resolve with right creds: %v", err)
	}
}

// TestPrivateImageCacheNeedsCredentials: once one caller has pulled a
// private image with credentials, another caller of the same store (another
// workspace) gets the cached copy only by presenting valid credentials.
func TestPrivateImageCacheNeedsCredentials(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartAuthRegistry(t, "alice", "s3cret")
	ref := imagetest.PushAuth(t, host, "private/app:2", overlayStack(t), "alice", "s3cret")
	ctx := context.Background()
	s := newStore(t)
	good := &authn.Basic{Username: "alice", Password: "s3cret"}
	first, err := s.Resolve(ctx, wsA, ref, good, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, auth := range []authn.Authenticator{nil, &authn.Basic{Username: "alice", Password: "wrong"}} {
		if _, err := s.Resolve(ctx, wsA, ref, auth, nil); !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("cached private image with %v: %v, want ErrUnauthorized", auth, err)
		}
	}
	again, err := s.Resolve(ctx, wsA, ref, good, nil)
	if err != nil || again.Digest != first.Digest || again.Layers[0] != first.Layers[0] {
		t.Fatalf("cached private image with right creds: %+v %v", again, err)
	}
}

func TestConcurrentResolveUnpacksOnce(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	stack := overlayStack(t)
	ref := imagetest.Push(t, host, "test/shared:1", stack)
	s := newStore(t)

	const n = 8
	imgs := make([]*Image, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { imgs[i], errs[i] = s.Resolve(context.Background(), wsA, ref, nil, nil) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Resolve #%d: %v", i, errs[i])
		}
		if strings.Join(imgs[i].Layers, ":") != strings.Join(imgs[0].Layers, ":") {
			t.Errorf("Resolve #%d layers %v, want %v", i, imgs[i].Layers, imgs[0].Layers)
		}
	}
	if got := s.unpacks.Load(); got != 2 {
		t.Errorf("unpacked %d layers, want 2", got)
	}

	// An image sharing the bottom layer unpacks only its new one.
	layers, _ := stack.Layers()
	extra := imagetest.Layer(t, imagetest.File("extra", 0o644, "e"))
	ref2 := imagetest.Push(t, host, "test/child:1", imagetest.Image(t, v1.Config{}, layers[0], extra))
	child, err := s.Resolve(context.Background(), wsA, ref2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if child.Layers[0] != imgs[0].Layers[0] || s.unpacks.Load() != 3 {
		t.Errorf("child layers %v, %d unpacks; want shared bottom layer and 3 unpacks", child.Layers, s.unpacks.Load())
	}
}

func TestRunConfigFromImageConfig(t *testing.T) {
	requireRoot(t)
	cfg := v1.Config{User: "app", WorkingDir: "/work", Env: []string{"A=1", "B=x=y", "EMPTY=", "BARE"}}
	host := imagetest.StartRegistry(t)
	img := imagetest.Image(t, cfg, imagetest.Layer(t, imagetest.Dir("work/", 0o755)))
	got, err := newStore(t).Resolve(context.Background(), wsA, imagetest.Push(t, host, "test/cfg:1", img), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	rc := got.Config
	want := map[string]string{"A": "1", "B": "x=y", "EMPTY": "", "BARE": ""}
	if rc.User != "app" || rc.WorkDir != "/work" || len(rc.EnvVars) != len(want) {
		t.Fatalf("RunConfig = %+v", rc)
	}
	for k, v := range want {
		if rc.EnvVars[k] != v {
			t.Errorf("EnvVars[%s] = %q, want %q", k, rc.EnvVars[k], v)
		}
	}
}

func TestListAndRemove(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	ref := imagetest.Push(t, host, "test/list:1", overlayStack(t))
	s := newStore(t)
	ctx := context.Background()
	img, err := s.Resolve(ctx, wsA, ref, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.List(ctx, wsA)
	if err != nil || len(list) != 1 || list[0].Ref != ref || list[0].Digest != img.Digest {
		t.Fatalf("List = %v, %v; want [%s]", list, err, ref)
	}
	if err := s.Remove(ctx, wsA, ref); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := s.Remove(ctx, wsA, ref); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Remove = %v, want ErrNotFound", err)
	}
	// Its only name gone, the workspace no longer holds the image.
	if list, _ := s.List(ctx, wsA); len(list) != 0 {
		t.Errorf("List after Remove(ref) = %v, want empty", list)
	}
	if err := s.Remove(ctx, wsA, img.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove(digest) of an unnamed image = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(img.Layers[0]); err != nil {
		t.Errorf("layer dir removed with the ref (%v); only GC frees layers", err)
	}
}

func TestInsecureRegistries(t *testing.T) {
	s, err := NewStore(t.TempDir(), WithInsecureRegistries([]string{"reg.internal:5000", "plain.lan"}))
	if err != nil {
		t.Fatal(err)
	}
	for reg, want := range map[string]bool{
		"localhost:5000": true, "127.0.0.1:1234": true, "[::1]:5000": true, "localhost": true,
		"reg.internal:5000": true, "reg.internal:6000": false, "plain.lan:443": true,
		"index.docker.io": false, "ghcr.io": false,
	} {
		if got := s.isInsecure(reg); got != want {
			t.Errorf("isInsecure(%s) = %v, want %v", reg, got, want)
		}
	}
}

// lyingLayer claims a diffID its content does not have.
type lyingLayer struct{ v1.Layer }

func (lyingLayer) DiffID() (v1.Hash, error) {
	return v1.NewHash("sha256:" + strings.Repeat("ab", 32))
}

func TestCorruptLayerIsNotPublished(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	bad := lyingLayer{imagetest.Layer(t, imagetest.File("f", 0o644, "x"))}
	ref := imagetest.Push(t, host, "test/corrupt:1", imagetest.Image(t, v1.Config{}, bad))
	s := newStore(t)
	if _, err := s.Resolve(context.Background(), wsA, ref, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Resolve = %v, want ErrInvalid (diff_id mismatch)", err)
	}
	for _, d := range []string{"layers/sha256", "tmp", "refs"} {
		ents, _ := os.ReadDir(filepath.Join(s.Root(), d))
		if len(ents) != 0 {
			t.Errorf("%s holds %d entries after a failed pull, want none", d, len(ents))
		}
	}
}

func TestResolveRefusesHostileLayer(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	evil := imagetest.Layer(t, imagetest.File("../../../../evil-from-pull", 0o644, "x"))
	ref := imagetest.Push(t, host, "test/evil:1", imagetest.Image(t, v1.Config{}, evil))
	s := newStore(t)
	if _, err := s.Resolve(context.Background(), wsA, ref, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Resolve = %v, want ErrInvalid (path traversal)", err)
	}
	if list, _ := s.List(context.Background(), wsA); len(list) != 0 {
		t.Errorf("hostile image was recorded: %v", list)
	}
}

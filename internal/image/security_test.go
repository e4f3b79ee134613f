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
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
)

func limitedStore(t *testing.T, l Limits) *Store {
	t.Helper()
	s, err := NewStore(filepath.Join(t.TempDir(), "images"), WithLogger(slog.New(slog.DiscardHandler)), WithLimits(l))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// diskBytes is the space allocated under dir (what du counts).
func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			if st, ok := fi.Sys().(interface{ Blocks() int64 }); ok {
				n += st.Blocks() * 512
			} else {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// TestDigestRefsDoNotCrossWorkspaces: workspace A pulls a private image;
// workspace B, naming it by bare digest or by any repo@digest, gets the
// same answer as for an image no one has, and does not see it listed.
func TestDigestRefsDoNotCrossWorkspaces(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartAuthRegistry(t, "alice", "s3cret")
	ref := imagetest.PushAuth(t, host, "private/app:1", overlayStack(t), "alice", "s3cret")
	pub := imagetest.StartRegistry(t)
	ctx := context.Background()
	s := newStore(t)
	img, err := s.Resolve(ctx, wsA, ref, &authn.Basic{Username: "alice", Password: "s3cret"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(ctx, wsB, img.Digest, nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("B: Resolve(bare digest) = %v, want ErrNotFound", err)
	}
	for _, r := range []string{
		host + "/private/app@" + img.Digest, // the real repo, without credentials
		pub + "/any/repo@" + img.Digest,     // a repo that does not have it
	} {
		if got, err := s.Resolve(ctx, wsB, r, nil, nil); err == nil {
			t.Errorf("B: Resolve(%s) = %s, want an error", r, got.Digest)
		} else if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrUnauthorized) {
			t.Errorf("B: Resolve(%s) = %v, want ErrNotFound or ErrUnauthorized", r, err)
		}
	}
	if list, err := s.List(ctx, wsB); err != nil || len(list) != 0 {
		t.Errorf("B: List = %v, %v; want nothing", list, err)
	}
	if err := s.Remove(ctx, wsB, img.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("B: Remove(A's digest) = %v, want ErrNotFound", err)
	}
	if n, _ := s.Usage(ctx, wsB); n != 0 {
		t.Errorf("B: Usage = %d, want 0", n)
	}
	if n, _ := s.Usage(ctx, wsA); n != img.Size || n == 0 {
		t.Errorf("A: Usage = %d, want the image's %d bytes", n, img.Size)
	}
	if got, err := s.Resolve(ctx, wsA, img.Digest, nil, nil); err != nil || got.Digest != img.Digest {
		t.Errorf("A: Resolve(own digest) = %v", err)
	}
}

// TestLoadedNamesArePerWorkspace: B loads an archive under the name A
// resolves; A still gets its own image, B its own.
func TestLoadedNamesArePerWorkspace(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	ref := imagetest.Push(t, host, "team/app:1", overlayStack(t))
	ctx := context.Background()
	s := newStore(t)
	mine, err := s.Resolve(ctx, wsA, ref, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	evil := imagetest.Image(t, v1.Config{Env: []string{"EVIL=1"}}, imagetest.Layer(t, imagetest.File("evil", 0o644, "x")))
	loaded, err := s.Load(ctx, wsB, imagetest.WriteDockerArchive(t, evil, ref), ref)
	if err != nil || loaded[0].Digest == mine.Digest {
		t.Fatalf("B: Load = %v, %v", loaded, err)
	}
	if got, err := s.Resolve(ctx, wsA, ref, nil, nil); err != nil || got.Digest != mine.Digest {
		t.Fatalf("A: Resolve(%s) after B's load = %v, %v; want A's %s", ref, got, err, mine.Digest)
	}
	if got, err := s.Resolve(ctx, wsB, ref, nil, nil); err != nil || got.Digest != loaded[0].Digest {
		t.Fatalf("B: Resolve(%s) = %v, %v; want B's own", ref, got, err)
	}
}

// TestForgedDiffIDGetsNoLayer: B's image claims the diffID of a layer only
// A's private image has, with other content; B's pull is refused rather
// than handed A's layer from disk.
func TestForgedDiffIDGetsNoLayer(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartAuthRegistry(t, "alice", "s3cret")
	secret := imagetest.Layer(t, imagetest.File("secret", 0o600, "A's secret"))
	ref := imagetest.PushAuth(t, host, "private/s:1", imagetest.Image(t, v1.Config{}, secret), "alice", "s3cret")
	ctx := context.Background()
	s := newStore(t)
	if _, err := s.Resolve(ctx, wsA, ref, &authn.Basic{Username: "alice", Password: "s3cret"}, nil); err != nil {
		t.Fatal(err)
	}
	id, _ := secret.DiffID()
	forged := forgedLayer{Layer: imagetest.Layer(t, imagetest.File("other", 0o644, "x")), id: id}
	pub := imagetest.StartRegistry(t)
	bref := imagetest.Push(t, pub, "b/forged:1", imagetest.Image(t, v1.Config{}, forged))
	if got, err := s.Resolve(ctx, wsB, bref, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("B: Resolve(forged diffID) = %v, %v; want ErrInvalid", got, err)
	}
}

type forgedLayer struct {
	v1.Layer
	id v1.Hash
}

func (f forgedLayer) DiffID() (v1.Hash, error) { return f.id, nil }

// TestDecompressionBombsStopAtCap: a sparse-file tar of ~1.5 KiB claiming
// 1 GiB and a gzip layer of 64 MiB of zeros fail at the cap, leaving no
// more on disk than the cap.
func TestDecompressionBombsStopAtCap(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	const capBytes = 4 << 20
	for name, tarData := range map[string][]byte{
		"sparse": imagetest.SparseBombTar(t, 1<<30),
		"gzip":   imagetest.ZerosTar(t, 64<<20),
	} {
		t.Run(name, func(t *testing.T) {
			ref := imagetest.Push(t, host, "bomb/"+name+":1", imagetest.Image(t, v1.Config{}, imagetest.LayerFromTar(t, tarData)))
			s := limitedStore(t, Limits{ImageBytes: 2 * capBytes, LayerBytes: capBytes})
			_, err := s.Resolve(context.Background(), wsA, ref, nil, nil)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "per-layer cap") {
				t.Fatalf("Resolve(bomb) = %v, want ErrInvalid naming the per-layer cap", err)
			}
			if n := diskBytes(t, s.Root()); n > capBytes+(1<<20) {
				t.Errorf("store holds %d bytes after the bomb, cap %d", n, capBytes)
			}
			if list, _ := s.List(context.Background(), wsA); len(list) != 0 {
				t.Errorf("bomb recorded: %v", list)
			}
		})
	}
}

// TestImageCapSpansLayers: layers each under the layer cap still stop at
// the image cap.
func TestImageCapSpansLayers(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	var layers []v1.Layer
	for i := range 3 {
		layers = append(layers, imagetest.Layer(t, imagetest.File("f"+string(rune('a'+i)), 0o644, strings.Repeat("x", 3<<20))))
	}
	ref := imagetest.Push(t, host, "big/three:1", imagetest.Image(t, v1.Config{}, layers...))
	s := limitedStore(t, Limits{ImageBytes: 8 << 20, LayerBytes: 4 << 20})
	if _, err := s.Resolve(context.Background(), wsA, ref, nil, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "per-image cap") {
		t.Fatalf("Resolve = %v, want the per-image cap", err)
	}
}

// TestHugeConfigAndManifestAreRefused: a config of 9 MiB of Env, an Env
// over the run-config cap, and a 5 MiB manifest are refused at their caps.
func TestHugeConfigAndManifestAreRefused(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	layer := imagetest.Layer(t, imagetest.File("f", 0o644, "x"))
	bigManifest, err := mutate.Annotations(imagetest.Image(t, v1.Config{}, layer), map[string]string{"pad": strings.Repeat("m", 5<<20)}).(v1.Image)
	if !err {
		t.Fatal("annotated image is not an image")
	}
	for name, c := range map[string]struct {
		img  v1.Image
		want string
	}{
		"config":     {imagetest.Image(t, v1.Config{Env: []string{"E=" + strings.Repeat("e", 9<<20)}}, layer), "image config is larger than 8.0 MiB"},
		"run-config": {imagetest.Image(t, v1.Config{Env: []string{"E=" + strings.Repeat("e", 2<<20)}}, layer), "Env is larger than 1.0 MiB"},
		"manifest":   {bigManifest, "larger than 4.0 MiB"},
	} {
		t.Run(name, func(t *testing.T) {
			ref := imagetest.Push(t, host, "huge/"+name+":1", c.img)
			s := newStore(t)
			if _, err := s.Resolve(context.Background(), wsA, ref, nil, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Resolve = %v, want ErrInvalid with %q", err, c.want)
			}
		})
	}
}

// TestGCFreesUnreferencedLayers: after rm, GC frees the layers no image
// and no snapshot uses, and keeps those a snapshot stacks.
func TestGCFreesUnreferencedLayers(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	ctx := context.Background()
	s := newStore(t)
	a, err := s.Resolve(ctx, wsA, imagetest.Push(t, host, "gc/a:1", imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.File("a", 0o644, strings.Repeat("a", 1<<20))))), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Resolve(ctx, wsA, imagetest.Push(t, host, "gc/b:1", imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.File("b", 0o644, "b")))), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a.Release()
	b.Release()
	if res, err := s.GC(ctx, nil); err != nil || res.Layers != 0 {
		t.Fatalf("GC with every image named = %+v, %v; want nothing freed", res, err)
	}
	for _, img := range []*Image{a, b} {
		if err := s.Remove(ctx, wsA, img.Ref); err != nil {
			t.Fatal(err)
		}
	}
	before := diskBytes(t, s.Root())
	res, err := s.GC(ctx, b.Layers) // a snapshot still stacks b's layer
	if err != nil || res.Images != 2 || res.Layers != 1 || res.Bytes < 1<<20 {
		t.Fatalf("GC = %+v, %v; want 2 images and a's 1 MiB layer freed", res, err)
	}
	if _, err := os.Stat(a.Layers[0]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a's layer still there: %v", err)
	}
	if _, err := os.Stat(b.Layers[0]); err != nil {
		t.Errorf("b's layer, in use by a snapshot, was freed: %v", err)
	}
	if after := diskBytes(t, s.Root()); before-after < 1<<20 {
		t.Errorf("disk use %d → %d; want at least 1 MiB freed", before, after)
	}
	if n, _ := s.Usage(ctx, wsA); n != 0 {
		t.Errorf("Usage after rm = %d, want 0", n)
	}
}

// TestGCKeepsHeldLayers: the layers of a resolved image survive GC until
// the caller releases it (it has not recorded them in a snapshot yet), even
// when the image loses its name meanwhile.
func TestGCKeepsHeldLayers(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	ctx := context.Background()
	s := newStore(t)
	ref := imagetest.Push(t, host, "gc/pin:1", imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.File("p", 0o644, "p"))))
	first, err := s.Resolve(ctx, wsA, ref, nil, nil) // pulled
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.Resolve(ctx, wsA, ref, nil, nil) // found locally
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, wsA, ref); err != nil {
		t.Fatal(err)
	}
	for i, img := range []*Image{first, again} {
		if res, err := s.GC(ctx, nil); err != nil || res.Layers != 0 {
			t.Fatalf("GC with %d holder(s) left = %+v, %v; want the layer kept", 2-i, res, err)
		}
		img.Release()
	}
	if res, err := s.GC(ctx, nil); err != nil || res.Layers != 1 {
		t.Fatalf("GC after release = %+v, %v; want the layer freed", res, err)
	}
}

// TestLegacyRefsGoToDefaultWorkspace: names written before they were per
// workspace belong to the default workspace after an upgrade, and to no
// other.
func TestLegacyRefsGoToDefaultWorkspace(t *testing.T) {
	requireRoot(t)
	host := imagetest.StartRegistry(t)
	ctx := context.Background()
	s := newStore(t)
	img, err := s.Resolve(ctx, legacyWorkspace, imagetest.Push(t, host, "old/img:1", overlayStack(t)), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Rewrite the entry as the old format: no workspace, keyed by ref alone.
	if err := os.Remove(s.refPath(legacyWorkspace, img.Ref)); err != nil {
		t.Fatal(err)
	}
	if err := s.writeJSON(filepath.Join(s.Root(), "refs", "legacy.json"), refEntry{Ref: img.Ref, Digest: img.Digest}); err != nil {
		t.Fatal(err)
	}
	// And an image loaded untagged, which old stores named nowhere.
	untagged, err := s.Resolve(ctx, wsA, imagetest.Push(t, host, "old/untagged:1", imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.File("u", 0o644, "u")))), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(s.refPath(wsA, untagged.Ref)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(s.Root(), "version")); err != nil {
		t.Fatal(err)
	}
	s2, err := NewStore(s.Root(), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	list, _ := s2.List(ctx, legacyWorkspace)
	if len(list) != 2 || list[0].Ref != "" || list[0].Digest != untagged.Digest || list[1].Digest != img.Digest {
		t.Errorf("default workspace after upgrade lists %v, want the untagged image and %s", list, img.Ref)
	}
	if res, err := s2.GC(ctx, nil); err != nil || res.Layers != 0 {
		t.Errorf("GC after upgrade = %+v, %v; want nothing freed", res, err)
	}
	if list, _ := s2.List(ctx, wsB); len(list) != 0 {
		t.Errorf("another workspace after upgrade lists %v", list)
	}
}

// TestZstdWindowIsBounded: a zstd frame asking for a 512 MiB window (which
// the decoder would allocate) is refused.
func TestZstdWindowIsBounded(t *testing.T) {
	// Magic, frame header (no flags), window descriptor 2^29, then one
	// empty last raw block.
	frame := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 19 << 3, 0x01, 0x00, 0x00}
	zr, err := decompress(bytes.NewReader(frame))
	if err == nil {
		_, err = io.Copy(io.Discard, zr)
		zr.Close()
	}
	if err == nil {
		t.Fatal("a 512 MiB zstd window was accepted")
	}
	frame[5] = 10 << 3 // 1 MiB: fine
	zr, err = decompress(bytes.NewReader(frame))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, zr); err != nil {
		t.Errorf("1 MiB window: %v", err)
	}
}

// TestRedirectedManifestIsCapped: a 5 MiB manifest behind a redirect (as
// to a CDN) is cut off at the cap, while a large blob behind one still
// downloads whole.
func TestRedirectedManifestIsCapped(t *testing.T) {
	requireRoot(t)
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/cdn/huge-manifest":
			w.Header().Set("Content-Type", string(types.OCIManifestSchema1))
			w.Write(bytes.Repeat([]byte(" "), 5<<20))
		case strings.HasPrefix(r.URL.Path, "/cdn/"):
			r.URL.Path = strings.TrimPrefix(r.URL.Path, "/cdn")
			reg.ServeHTTP(w, r)
		case strings.Contains(r.URL.Path, "/hostile/") && strings.Contains(r.URL.Path, "/manifests/"):
			http.Redirect(w, r, "/cdn/huge-manifest", http.StatusTemporaryRedirect)
		case strings.Contains(r.URL.Path, "/blobs/sha256:") && r.Method == http.MethodGet:
			http.Redirect(w, r, "/cdn"+r.URL.Path, http.StatusTemporaryRedirect)
		default:
			reg.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	s := newStore(t)
	ctx := context.Background()
	// Cut off while reading (named by its path), not read whole first.
	if _, err := s.Resolve(ctx, wsA, host+"/hostile/x:1", nil, nil); err == nil || !strings.Contains(err.Error(), "manifest /cdn/huge-manifest is larger than 4.0 MiB") {
		t.Errorf("5 MiB redirected manifest: %v, want cut off at the cap", err)
	}
	big := imagetest.Image(t, v1.Config{}, imagetest.Layer(t, imagetest.File("big", 0o644, strings.Repeat("b", 6<<20))))
	ref := imagetest.Push(t, host, "cdn/big:1", big)
	if img, err := s.Resolve(ctx, wsA, ref, nil, nil); err != nil || img.Size < 6<<20 {
		t.Errorf("6 MiB layer through a redirect: %v", err)
	}
}

package image

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"

	"github.com/dustin/go-humanize"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Caps on the small documents of an image, which are read into memory.
// Everything registry- or archive-controlled is read through a limit.
const (
	// MaxManifestBytes caps a manifest or index: the limit of the
	// distribution registry and containerd (4 MiB). go-containerregistry's
	// own is 100 MiB.
	MaxManifestBytes = 4 << 20
	// MaxConfigBytes caps an image config. Real configs are a few KiB; one
	// with 100 MiB of Env once took the daemon to 1.1 GB RSS.
	MaxConfigBytes = 8 << 20
	// MaxRunConfigBytes caps the user, working dir and Env an image
	// passes to every command. Linux refuses an execve whose environment
	// exceeds 2 MiB (ARG_MAX), so a larger one could not start a command.
	MaxRunConfigBytes = 1 << 20
	// MaxLayers caps the layers of one image (overlayfs stacks at most
	// ~500 lowers, and Docker refuses builds past 127).
	MaxLayers = 128
)

// entryCost is what each tar entry is charged beyond its content: a tar
// header's worth, so a layer of a million empty files is bounded too.
const entryCost = 512

// Limits bound what one image may unpack to on disk.
type Limits struct {
	// ImageBytes caps the bytes one pull or load unpacks (all its new
	// layers). 0 means half the free space of the store's filesystem when
	// the pull starts.
	ImageBytes int64
	// LayerBytes caps one layer's unpacked bytes and its uncompressed
	// stream. 0 (or more than ImageBytes) means ImageBytes.
	LayerBytes int64
}

// WithLimits sets the unpacked-size caps (see Limits).
func WithLimits(l Limits) Option { return func(s *Store) { s.limits = l } }

// budget is the unpacked-size allowance of one ingest, shared by its
// concurrently unpacking layers.
type budget struct {
	image, layer int64
	used         atomic.Int64
}

// newBudget resolves the store's limits against the free space now.
func (s *Store) newBudget() (*budget, error) {
	b := &budget{image: s.limits.ImageBytes, layer: s.limits.LayerBytes}
	if b.image <= 0 {
		var st unix.Statfs_t
		if err := unix.Statfs(s.root, &st); err != nil {
			return nil, fmt.Errorf("free space of image store: %w", err)
		}
		b.image = int64(st.Bavail) * st.Bsize / 2
	}
	if b.layer <= 0 || b.layer > b.image {
		b.layer = b.image
	}
	return b, nil
}

// MaxArchiveBytes is how large an archive Load accepts now: the image cap.
func (s *Store) MaxArchiveBytes() (int64, error) {
	b, err := s.newBudget()
	if err != nil {
		return 0, err
	}
	return b.image, nil
}

func (b *budget) imageErr() error {
	return fmt.Errorf("image unpacks to more than %s, the per-image cap (--image-max-bytes): %w", humanize.IBytes(uint64(b.image)), errdefs.ErrInvalid)
}

func (b *budget) layerErr() error {
	return fmt.Errorf("layer unpacks to more than %s, the per-layer cap (--image-layer-max-bytes): %w", humanize.IBytes(uint64(b.layer)), errdefs.ErrInvalid)
}

// layerMeter charges one layer's disk writes to its own cap and to the
// image's budget.
type layerMeter struct {
	b    *budget
	used int64
}

func (m *layerMeter) charge(n int64) error {
	m.used += n
	if m.used > m.b.layer {
		return m.b.layerErr()
	}
	if m.b.used.Add(n) > m.b.image {
		return m.b.imageErr()
	}
	return nil
}

// capReader fails once more than max bytes have been read from r, so a
// decompression bomb is stopped at the cap instead of read to its end.
type capReader struct {
	r   io.Reader
	n   int64
	max int64
	err func() error
}

func (c *capReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.max {
		return n, c.err()
	}
	return n, err
}

func tooBig(what string, max int64) error {
	return fmt.Errorf("%s is larger than %s, the cap: %w", what, humanize.IBytes(uint64(max)), errdefs.ErrInvalid)
}

// manifestCapTransport cuts manifest responses off at MaxManifestBytes,
// also when the registry redirects them elsewhere: go-containerregistry
// reads up to 100 MiB of one into memory. Its token and error reads are
// bounded already, and blob reads by their descriptor's size and the layer
// caps.
type manifestCapTransport struct{ base http.RoundTripper }

func (t manifestCapTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil || !fetchesManifest(req) {
		return resp, err
	}
	what := "manifest " + req.URL.Path
	if resp.ContentLength > MaxManifestBytes {
		resp.Body.Close()
		return nil, tooBig(what, MaxManifestBytes)
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{&capReader{r: resp.Body, max: MaxManifestBytes, err: func() error { return tooBig(what, MaxManifestBytes) }}, resp.Body}
	return resp, nil
}

// fetchesManifest reports whether req asks for a manifest, directly or as
// a redirect of such a request.
func fetchesManifest(req *http.Request) bool {
	for r := req; r != nil; {
		if strings.Contains(r.URL.Path, "/manifests/") {
			return true
		}
		if r.Response == nil {
			return false
		}
		r = r.Response.Request
	}
	return false
}

// Package image turns OCI images — pulled from a registry or loaded from a
// `docker save` / OCI archive — into a content-addressed local store of
// unpacked layer directories that overlayfs can stack directly.
//
// Layout under the store root:
//
//	layers/sha256/<hex>/     one unpacked layer, named by its diffID; the
//	                         directory is an overlayfs lower layer (OCI
//	                         whiteouts already translated) and is never
//	                         written again once it appears
//	layers/sha256/<hex>.json sidecar: the layer's uncompressed size
//	blobs/sha256/<hex>       raw manifests and image configs
//	images/<hex>.json        one record per image, keyed by manifest digest
//	refs/<sha256(ws,ref)>.json  one workspace's name → manifest digest
//	tmp/                     staging; anything here is garbage at startup
//	version                  layout version ("2": names are per workspace)
//
// Invariants: a layer directory appears only through an atomic rename of a
// fully unpacked, diffID-verified staging directory, and an image record or
// ref is written only after all of its layers are present. So a reader that
// sees a ref may use every layer it names without locking. Layers are
// shared on disk by every workspace (content-addressed), but a workspace
// reaches an image only through its own refs, and reuses a layer it does
// not already hold only after the layer's bytes, from its own source, hash
// to the same diffID. GC deletes what no ref, no snapshot and no caller
// holding a resolved image uses. What one pull or load may unpack is
// capped (Limits), and its manifest and config are read through caps.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/keyed"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Image is a locally available image: every path in Layers exists and is
// complete when an Image is returned.
type Image struct {
	// Ref is the canonical reference the image is known by
	// (e.g. "index.docker.io/library/busybox:latest"), or "" for an
	// untagged image loaded from an archive.
	Ref string
	// Digest is the manifest digest ("sha256:…").
	Digest string
	// Layers are absolute paths of the unpacked layer directories, bottom
	// layer first. overlayfs wants the opposite order in lowerdir=.
	Layers []string
	// Config is the image's run configuration (user, working dir, env).
	Config protocol.RunConfig
	// Size is the sum of the layers' uncompressed tar sizes in bytes.
	Size int64

	// release unpins Layers (see Release); nil once released.
	release func()
}

// Release ends the caller's hold on the image's layers. Until then GC
// keeps them even if the image loses its last name, so a caller that
// records the layers elsewhere (a snapshot) releases only after recording
// them. Safe to call more than once.
func (img *Image) Release() {
	if img != nil && img.release != nil {
		img.release()
		img.release = nil
	}
}

// hold pins img's layers for its caller and checks they are still there
// (GC may have taken them just before the pin).
func (s *Store) hold(img *Image) (*Image, error) {
	diffIDs := make([]string, len(img.Layers))
	for i, dir := range img.Layers {
		diffIDs[i] = "sha256:" + filepath.Base(dir)
	}
	unpin := s.pin(diffIDs)
	for _, dir := range img.Layers {
		if _, err := os.Stat(dir); err != nil {
			unpin()
			return nil, fmt.Errorf("image %s: layer %s: %w", img.Digest, filepath.Base(dir), errdefs.ErrNotFound)
		}
	}
	img.release = unpin
	return img, nil
}

// Progress reports bytes of layer data transferred during a pull (or read
// during a load). Total is fixed for one Resolve call; Complete only grows.
type Progress struct {
	Total    int64
	Complete int64
}

// Option configures a Store.
type Option func(*Store)

// WithInsecureRegistries lists registries (HOST or HOST:PORT) reached over
// plain HTTP or HTTPS without certificate verification. Loopback
// registries are always treated this way.
func WithInsecureRegistries(hosts []string) Option {
	return func(s *Store) {
		for _, h := range hosts {
			s.insecure[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
}

// WithLogger sets the logger for pull and unpack events.
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) {
		if l != nil {
			s.log = l
		}
	}
}

// WithFaults arms the store's crash points (internal/fault); nil arms none.
func WithFaults(f *fault.Injector) Option {
	return func(s *Store) { s.faults = f }
}

// PullMeter counts registry pulls for metrics (internal/telemetry).
type PullMeter interface {
	// ImagePull counts one pull that transferred bytes of layer data and
	// ended with err.
	ImagePull(bytes int64, err error)
}

type nopPullMeter struct{}

func (nopPullMeter) ImagePull(int64, error) {}

// WithPullMeter reports every registry pull to m.
func WithPullMeter(m PullMeter) Option {
	return func(s *Store) {
		if m != nil {
			s.meter = m
		}
	}
}

// Store is a content-addressed image store rooted in one directory. It is
// safe for concurrent use by many goroutines; it assumes it is the only
// process writing under its root.
type Store struct {
	root     string
	log      *slog.Logger
	meter    PullMeter
	insecure map[string]bool
	faults   *fault.Injector

	limits Limits

	// index serialises writes to refs/ and images/ (commit, Remove, GC).
	index sync.Mutex

	locks   keyed.Locks[string] // per-diffID unpack locks
	locksMu sync.Mutex          // guards pins
	// pins counts the ingests using each diffID, from before they look
	// for the layer until their image is recorded. GC deletes a layer only
	// while holding its lock and seeing no pin, so it never deletes one an
	// ingest has found present but not yet recorded.
	pins map[string]int

	unpacks atomic.Int64 // layers unpacked by this Store; for tests
}

// NewStore opens (creating if needed) a store at root. Staging leftovers
// from a previous crash are removed.
func NewStore(root string, opts ...Option) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("image store %s: %w", root, err)
	}
	s := &Store{
		root:     abs,
		log:      slog.Default(),
		meter:    nopPullMeter{},
		insecure: map[string]bool{},
		pins:     map[string]int{},
	}
	for _, o := range opts {
		o(s)
	}
	if err := os.RemoveAll(filepath.Join(abs, "tmp")); err != nil {
		return nil, fmt.Errorf("image store: clear staging: %w", err)
	}
	for _, d := range []string{"layers/sha256", "blobs/sha256", "images", "refs", "tmp"} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o700); err != nil {
			return nil, fmt.Errorf("image store: create %s: %w", d, err)
		}
	}
	// The store root must be traversable so overlayfs mounts made in other
	// user namespaces can reach the layers; the layers dir holds no secrets.
	for _, d := range []string{".", "layers", "layers/sha256"} {
		if err := os.Chmod(filepath.Join(abs, d), 0o711); err != nil {
			return nil, fmt.Errorf("image store: chmod %s: %w", d, err)
		}
	}
	if err := s.migrate(); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	return s, nil
}

// Root returns the store's absolute root directory.
func (s *Store) Root() string { return s.root }

// record is the on-disk form of an image (images/<hex>.json). Its run
// config is kept here once; snapshots copy only what they need.
type record struct {
	Digest  string             `json:"digest"`
	Config  string             `json:"config"`
	DiffIDs []string           `json:"diff_ids"`
	Size    int64              `json:"size"`
	Run     protocol.RunConfig `json:"run_config"`
}

// refEntry is the on-disk form of one workspace's name for an image
// (refs/<sha256(workspace, name)>.json). Names are per workspace: a
// workspace may use an image only through an entry of its own, so one
// workspace's loads never shadow another's names and a digest another
// workspace pulled is unknown to it. An image loaded without a name gets
// an entry with an empty Ref, keyed by its digest.
type refEntry struct {
	Workspace string `json:"workspace"`
	Ref       string `json:"ref,omitempty"`
	Digest    string `json:"digest"`
	// Private marks an image pulled with credentials: a later Resolve of
	// the name must prove, with its own credentials, that the registry
	// still lets the caller pull it.
	Private bool `json:"private,omitempty"`
}

func hexOf(digest string) (string, error) {
	h, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(h) != 64 || strings.ToLower(h) != h {
		return "", fmt.Errorf("digest %q: %w", digest, errdefs.ErrInvalid)
	}
	if _, err := hex.DecodeString(h); err != nil {
		return "", fmt.Errorf("digest %q: %w", digest, errdefs.ErrInvalid)
	}
	return h, nil
}

func (s *Store) layerDir(diffID string) (string, error) {
	h, err := hexOf(diffID)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.root, "layers", "sha256", h), nil
}

// refPath is where workspace ws's entry for name (a canonical ref, or a
// digest for an untagged image) lives.
func (s *Store) refPath(ws, name string) string {
	sum := sha256.Sum256([]byte(ws + "\x00" + name))
	return filepath.Join(s.root, "refs", hex.EncodeToString(sum[:])+".json")
}

func (s *Store) entryPath(e refEntry) string {
	if e.Ref == "" {
		return s.refPath(e.Workspace, e.Digest)
	}
	return s.refPath(e.Workspace, e.Ref)
}

// writeFileAtomic replaces path with data, staged in the store's tmp dir
// so a crash leaves nothing in the directories the store lists.
func (s *Store) writeFileAtomic(path string, data []byte) error {
	return atomicfile.WriteFile(path, data, 0o600, atomicfile.WithTempDir(filepath.Join(s.root, "tmp")))
}

func (s *Store) writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return s.writeFileAtomic(path, b)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %w", filepath.Base(path), errdefs.ErrNotFound)
		}
		return err
	}
	return json.Unmarshal(b, v)
}

// putBlob stores a small raw blob (manifest or config) by its digest.
func (s *Store) putBlob(digest string, data []byte) error {
	h, err := hexOf(digest)
	if err != nil {
		return err
	}
	p := filepath.Join(s.root, "blobs", "sha256", h)
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	return s.writeFileAtomic(p, data)
}

// commit records an image whose layers are all present and names it in
// workspace ws: one entry per ref, or an untagged entry when refs is empty.
// It is the only writer of images/ and refs/ besides Remove and GC.
func (s *Store) commit(rec *record, ws string, refs []string, private bool) error {
	h, err := hexOf(rec.Digest)
	if err != nil {
		return err
	}
	s.index.Lock()
	defer s.index.Unlock()
	if err := s.writeJSON(filepath.Join(s.root, "images", h+".json"), rec); err != nil {
		return fmt.Errorf("write image record %s: %w", rec.Digest, err)
	}
	entries := []refEntry{{Workspace: ws, Digest: rec.Digest, Private: private}}
	if len(refs) > 0 {
		entries = entries[:0]
		for _, r := range refs {
			entries = append(entries, refEntry{Workspace: ws, Ref: r, Digest: rec.Digest, Private: private})
		}
	}
	for _, e := range entries {
		if err := s.writeJSON(s.entryPath(e), e); err != nil {
			return fmt.Errorf("write ref %s: %w", e.Ref, err)
		}
	}
	return nil
}

func (s *Store) readRecord(digest string) (*record, error) {
	h, err := hexOf(digest)
	if err != nil {
		return nil, err
	}
	var rec record
	if err := readJSON(filepath.Join(s.root, "images", h+".json"), &rec); err != nil {
		return nil, fmt.Errorf("image %s: %w", digest, err)
	}
	return &rec, nil
}

// imageByDigest builds an Image from its record, checking that every layer
// is still present. A missing record or layer yields ErrNotFound. It does
// not check who may use the image: callers go through entries first.
func (s *Store) imageByDigest(ref, digest string) (*Image, error) {
	rec, err := s.readRecord(digest)
	if err != nil {
		return nil, err
	}
	img := &Image{Ref: ref, Digest: rec.Digest, Config: rec.Run, Size: rec.Size}
	for _, d := range rec.DiffIDs {
		dir, err := s.layerDir(d)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("image %s: layer %s: %w", digest, d, errdefs.ErrNotFound)
		}
		img.Layers = append(img.Layers, dir)
	}
	return img, nil
}

// lookup returns workspace ws's image named by canonical ref and whether it
// was pulled with credentials, or an error wrapping ErrNotFound.
func (s *Store) lookup(ws, ref string) (*Image, bool, error) {
	var e refEntry
	if err := readJSON(s.refPath(ws, ref), &e); err != nil {
		return nil, false, fmt.Errorf("ref %s: %w", ref, err)
	}
	if e.Workspace != ws || e.Ref != ref {
		return nil, false, fmt.Errorf("ref %s: %w", ref, errdefs.ErrNotFound)
	}
	img, err := s.imageByDigest(ref, e.Digest)
	return img, e.Private, err
}

// byDigest returns the image with manifest digest if workspace ws holds it
// under any name; otherwise ErrNotFound, exactly as for a digest no one has,
// so a digest's presence in the shared store does not leak across
// workspaces.
func (s *Store) byDigest(ws, digest string) (*Image, error) {
	entries, err := s.entries(ws)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Digest == digest {
			return s.imageByDigest("", digest)
		}
	}
	return nil, fmt.Errorf("image %s: %w", digest, errdefs.ErrNotFound)
}

// List returns the images workspace ws may use: one entry per name, plus
// one with an empty Ref for each image it holds only untagged. Sorted by
// Ref, then Digest.
func (s *Store) List(ctx context.Context, ws string) ([]*Image, error) {
	entries, err := s.entries(ws)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, e := range entries {
		if e.Ref != "" {
			named[e.Digest] = true
		}
	}
	var out []*Image
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if e.Ref == "" && named[e.Digest] {
			continue
		}
		img, err := s.imageByDigest(e.Ref, e.Digest)
		if err != nil {
			s.log.Warn("image list: skipping broken ref", "ref", e.Ref, "digest", e.Digest, "err", err)
			continue
		}
		out = append(out, img)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Ref != out[j].Ref {
			return out[i].Ref < out[j].Ref
		}
		return out[i].Digest < out[j].Digest
	})
	return out, nil
}

// entries lists workspace ws's names ("" lists every workspace's).
func (s *Store) entries(ws string) ([]refEntry, error) {
	des, err := os.ReadDir(filepath.Join(s.root, "refs"))
	if err != nil {
		return nil, fmt.Errorf("list refs: %w", err)
	}
	var out []refEntry
	for _, de := range des {
		var e refEntry
		if err := readJSON(filepath.Join(s.root, "refs", de.Name()), &e); err != nil {
			continue // removed concurrently
		}
		if ws == "" || e.Workspace == ws {
			out = append(out, e)
		}
	}
	return out, nil
}

// Remove forgets one of workspace ws's names. Given a tag or name it
// removes just that name; given a bare manifest digest ("sha256:…") it
// removes every name of ws pointing at that image. A name ws does not have
// is ErrNotFound. Nothing is freed on disk until GC.
func (s *Store) Remove(ctx context.Context, ws, ref string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var victims []refEntry
	if IsDigest(ref) {
		entries, err := s.entries(ws)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if e.Digest == ref {
				victims = append(victims, e)
			}
		}
	} else {
		canon, err := s.canonical(ref)
		if err != nil {
			return fmt.Errorf("remove image %s: %w", ref, err)
		}
		victims = append(victims, refEntry{Workspace: ws, Ref: canon})
	}
	s.index.Lock()
	defer s.index.Unlock()
	removed := 0
	for _, e := range victims {
		err := os.Remove(s.entryPath(e))
		if err == nil {
			removed++
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove image %s: %w", ref, err)
		}
	}
	if removed == 0 {
		return fmt.Errorf("remove image %s: %w", ref, errdefs.ErrNotFound)
	}
	return nil
}

// Usage is the unpacked size of the images workspace ws holds, each layer
// counted once: what the workspace's images cost on disk, to be counted
// against its storage quota. Layers shared with other workspaces count for
// each of them.
func (s *Store) Usage(ctx context.Context, ws string) (int64, error) {
	entries, err := s.entries(ws)
	if err != nil {
		return 0, err
	}
	seen := map[string]bool{}
	var total int64
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if seen[e.Digest] {
			continue
		}
		seen[e.Digest] = true
		rec, err := s.readRecord(e.Digest)
		if err != nil {
			continue // removed concurrently
		}
		for _, d := range rec.DiffIDs {
			if seen[d] {
				continue
			}
			seen[d] = true
			if dir, err := s.layerDir(d); err == nil {
				size, _ := s.haveLayer(dir)
				total += size
			}
		}
	}
	return total, nil
}

// IsDigest reports whether ref is a bare manifest digest ("sha256:<hex>"),
// which names only an image the workspace already holds.
func IsDigest(ref string) bool {
	_, err := hexOf(ref)
	return err == nil
}

// pin marks diffIDs as used by an ingest; the returned func unpins them.
func (s *Store) pin(diffIDs []string) func() {
	s.locksMu.Lock()
	for _, d := range diffIDs {
		s.pins[d]++
	}
	s.locksMu.Unlock()
	return func() {
		s.locksMu.Lock()
		for _, d := range diffIDs {
			if s.pins[d]--; s.pins[d] == 0 {
				delete(s.pins, d)
			}
		}
		s.locksMu.Unlock()
	}
}

func (s *Store) pinned(diffID string) bool {
	s.locksMu.Lock()
	defer s.locksMu.Unlock()
	return s.pins[diffID] > 0
}

// lockLayer takes the per-diffID unpack lock, honouring ctx while waiting.
// The returned func releases it.
func (s *Store) lockLayer(ctx context.Context, diffID string) (func(), error) {
	return s.locks.Lock(ctx, diffID)
}

package mounts

import (
	"context"
	"errors"
	"io"
	"time"
)

// Backend is an object store as a bucket mount sees it: flat keys, "/" as
// the directory separator, whole-object writes. Every call is bounded by a
// deadline (callTimeout, or transfer progress for data; see progress), so
// a stalled store turns into EIO, never a hung process in the sandbox.
type Backend interface {
	// List returns the objects and the sub-prefixes ("dirs", ending in
	// "/") directly under prefix.
	List(ctx context.Context, prefix string) (objs []Object, dirs []string, err error)
	// ListAll returns every object whose key begins with prefix.
	ListAll(ctx context.Context, prefix string) ([]Object, error)
	// Stat returns key's object, or an error wrapping errNotFound.
	Stat(ctx context.Context, key string) (Object, error)
	// Get streams key's bytes from off to the end into w.
	Get(ctx context.Context, key string, off int64, w io.Writer) error
	// Put stores the first size bytes of r as key, replacing it.
	Put(ctx context.Context, key string, r io.ReaderAt, size int64) error
	// Copy copies src to dst on the store's side.
	Copy(ctx context.Context, src, dst string) error
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
}

// Object is one stored object.
type Object struct {
	Key     string
	Size    int64
	ModTime time.Time
	ETag    string
}

// Kinds of backend failure the file system tells apart (as ENOENT and
// EACCES); anything else is EIO.
var (
	errNotFound = errors.New("no such object")
	errDenied   = errors.New("access denied")
)

// callTimeout bounds one metadata call to the store.
const callTimeout = 30 * time.Second

// stallTimeout is how long a transfer may make no progress before it is
// abandoned.
const stallTimeout = 60 * time.Second

// progress cancels a transfer's context when no byte has moved through it
// for stallTimeout: a 1 GiB object may take minutes, a dead one may not.
type progress struct {
	timer  *time.Timer
	cancel context.CancelFunc
}

func withProgress(ctx context.Context) (context.Context, *progress) {
	ctx, cancel := context.WithCancel(ctx)
	p := &progress{cancel: cancel}
	p.timer = time.AfterFunc(stallTimeout, cancel)
	return ctx, p
}

func (p *progress) tick() { p.timer.Reset(stallTimeout) }

func (p *progress) done() {
	p.timer.Stop()
	p.cancel()
}

// progressReader ticks p on every read (uploads).
type progressReader struct {
	io.ReadSeeker
	p *progress
}

func (r progressReader) Read(b []byte) (int, error) {
	n, err := r.ReadSeeker.Read(b)
	if n > 0 {
		r.p.tick()
	}
	return n, err
}

// progressWriter ticks p on every write (downloads).
type progressWriter struct {
	w io.Writer
	p *progress
}

func (w progressWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	if n > 0 {
		w.p.tick()
	}
	return n, err
}

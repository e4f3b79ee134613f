// Package sandboxfs is how the daemon, root on the host, reads and writes
// files inside a sandbox's tree (its rootfs, upper dir or a captured
// layer). Whatever is there was put there by code the daemon does not
// trust, so every access here assumes the worst:
//
//   - paths resolve with openat2(RESOLVE_IN_ROOT): the kernel resolves
//     every symlink and ".." as the sandbox would see it, clamped to the
//     tree, so nothing planted inside leads to a host file;
//   - only regular files are opened for reading, checked on an O_PATH
//     handle before any real open, so a FIFO, socket or device node
//     planted at the path is refused without blocking or side effects;
//   - reads stop at a caller-given cap (never sized from stat: a sparse
//     file claims any size) and fail with ErrTooLarge past it;
//   - writes go to a fresh O_EXCL temp file in the target's directory,
//     renamed over the target, so whatever was there (a symlink, a FIFO)
//     is replaced, never opened or followed, and a reader inside never
//     sees half a file;
//   - every call runs under a deadline of at most OpTimeout.
package sandboxfs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// OpTimeout bounds every call, whatever the caller's context allows: a
// boot must not wait on anything a sandbox planted.
const OpTimeout = 5 * time.Second

// Typed failures caused by what the sandbox put at a path. Both are also
// errdefs.ErrInvalid.
var (
	ErrTooLarge   = fmt.Errorf("file over the size cap: %w", errdefs.ErrInvalid)
	ErrNotRegular = fmt.Errorf("not a regular file: %w", errdefs.ErrInvalid)
)

// Tree is a sandbox's directory tree, held open. Names given to its
// methods are slash-separated paths as the sandbox sees them ("/etc/hosts"
// or "etc/hosts"). Safe for concurrent use.
type Tree struct {
	fd int // O_PATH directory
}

// OpenTree opens the tree rooted at dir, a host path the daemon chose.
func OpenTree(dir string) (*Tree, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open sandbox tree", Path: dir, Err: err}
	}
	return &Tree{fd: fd}, nil
}

// Close releases the tree.
func (t *Tree) Close() error { return unix.Close(t.fd) }

// open opens the regular file name for reading.
func (t *Tree) open(ctx context.Context, name string) (*os.File, error) {
	if err := ctx.Err(); err != nil {
		return nil, pathErr("open", name, err)
	}
	pfd, err := t.resolve(clean(name), 0)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	defer unix.Close(pfd)
	return reopenRegular(pfd, name)
}

// ReadFile returns the contents of the regular file name, at most max
// bytes; a longer file fails with ErrTooLarge having read max+1 bytes.
func (t *Tree) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, OpTimeout)
	defer cancel()
	f, err := t.open(ctx, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readCapped(ctx, f, name, max)
}

// WriteFile makes name a regular file holding data with mode perm, owned
// by the daemon's user (root, which is root inside the sandbox too),
// creating missing parent directories (0755). Whatever was at name — a
// file, a symlink, a FIFO — is replaced atomically, never opened; a
// directory there is an error. A regular file already holding exactly
// data with mode perm is left alone, so a boot rewrites nothing, and needs
// no free space in a full sandbox, when nothing changed.
func (t *Tree) WriteFile(ctx context.Context, name string, data []byte, perm fs.FileMode) error {
	ctx, cancel := context.WithTimeout(ctx, OpTimeout)
	defer cancel()
	if err := ctx.Err(); err != nil {
		return pathErr("write", name, err)
	}
	rel := clean(name)
	dir, base := path.Split(rel)
	if base == "" || base == "." || base == ".." {
		return pathErr("write", name, fmt.Errorf("no file name: %w", errdefs.ErrInvalid))
	}
	dfd, err := t.mkdirAll(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return pathErr("mkdir", name, err)
	}
	defer unix.Close(dfd)
	if t.same(ctx, dfd, base, name, data, perm) {
		return nil
	}
	tmp, err := tempName(base)
	if err != nil {
		return pathErr("write", name, err)
	}
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(perm.Perm()))
	if err != nil {
		return pathErr("create", name, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	werr := writeAll(ctx, f, data)
	if werr == nil {
		werr = f.Chmod(perm.Perm()) // the umask applied at create
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = unix.Renameat(dfd, tmp, dfd, base)
	}
	if werr != nil {
		unix.Unlinkat(dfd, tmp, 0)
		return pathErr("write", name, werr)
	}
	return nil
}

// resolve opens rel (relative, cleaned) as an O_PATH handle, resolved as
// the sandbox would; extra adds open flags (O_DIRECTORY).
func (t *Tree) resolve(rel string, extra uint64) (int, error) {
	return t.openat2(rel, unix.O_PATH|extra, unix.RESOLVE_NO_MAGICLINKS)
}

// openat2 opens rel in the tree: always RESOLVE_IN_ROOT, plus resolve.
func (t *Tree) openat2(rel string, flags, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: flags | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT | resolve}
	// EAGAIN: a rename raced a ".." from a symlink. Retried a few times,
	// not forever: the sandbox may be renaming on purpose.
	for range 16 {
		fd, err := unix.Openat2(t.fd, rel, &how)
		if err != unix.EINTR && err != unix.EAGAIN {
			return fd, err
		}
	}
	return -1, unix.EAGAIN
}

// mkdirAll returns an O_PATH handle on directory rel, creating it and its
// parents in the tree as needed.
func (t *Tree) mkdirAll(rel string) (int, error) {
	if rel == "" {
		rel = "."
	}
	fd, err := t.resolve(rel, unix.O_DIRECTORY)
	if err == nil || !errors.Is(err, unix.ENOENT) || rel == "." {
		return fd, err
	}
	parent, base := path.Split(rel)
	pfd, err := t.mkdirAll(strings.TrimSuffix(parent, "/"))
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	if err := unix.Mkdirat(pfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, err
	}
	return t.resolve(rel, unix.O_DIRECTORY)
}

// same reports whether base in directory dfd is already a regular file
// holding exactly data with mode perm. Any doubt is "no".
func (t *Tree) same(ctx context.Context, dfd int, base, name string, data []byte, perm fs.FileMode) bool {
	pfd, err := unix.Openat(dfd, base, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	f, err := reopenRegular(pfd, name)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Mode() != perm.Perm() || fi.Size() != int64(len(data)) {
		return false
	}
	got, err := readCapped(ctx, f, name, int64(len(data)))
	return err == nil && bytes.Equal(got, data)
}

// reopenRegular opens the file behind O_PATH handle pfd for reading if it
// is a regular file. The check comes first and opens nothing; the reopen
// goes through the handle, so the file cannot be swapped in between.
func reopenRegular(pfd int, name string) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, pathErr("stat", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, pathErr("open", name, fmt.Errorf("%w (%s)", ErrNotRegular, fileType(st.Mode)))
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readCapped reads f to its end if that is at most max bytes.
func readCapped(ctx context.Context, f *os.File, name string, max int64) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(ctxReader{ctx, f}, max+1))
	if err != nil {
		return nil, pathErr("read", name, err)
	}
	if n > max {
		return nil, pathErr("read", name, fmt.Errorf("%w of %d bytes", ErrTooLarge, max))
	}
	return buf.Bytes(), nil
}

// writeAll writes data to f in chunks, stopping when ctx ends.
func writeAll(ctx context.Context, f *os.File, data []byte) error {
	const chunk = 1 << 20
	for len(data) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(len(data), chunk)
		if _, err := f.Write(data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// ctxReader fails reads once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// clean turns an in-sandbox path into one relative to the tree's root.
func clean(name string) string {
	if rel := path.Clean("/" + name)[1:]; rel != "" {
		return rel
	}
	return "."
}

func tempName(base string) (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "." + base + ".cubicle-" + hex.EncodeToString(b[:]), nil
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFDIR:
		return "directory"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "char device"
	case unix.S_IFBLK:
		return "block device"
	}
	return "unknown type"
}

// pathErr wraps err as a *fs.PathError naming the in-sandbox path, so
// errors.Is(err, fs.ErrNotExist) and friends keep working.
func pathErr(op, name string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &fs.PathError{Op: "sandbox " + op, Path: name, Err: err}
}

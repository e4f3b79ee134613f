package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// OCI whiteout markers and their overlayfs translations.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."     // AUFS bookkeeping (.wh..wh.plnk etc.); ignored
	opaqueMarker   = ".wh..wh..opq" // this directory hides everything below it
	opaqueXattr    = "trusted.overlay.opaque"
	paxXattrPrefix = "SCHILY.xattr."
)

// unpacker applies one layer tarball to an empty directory so that the
// directory is a valid overlayfs lower layer.
//
// Every filesystem operation is relative to a directory fd obtained with
// openat2(RESOLVE_IN_ROOT), and the final component is always a single name
// handled with *at calls that do not follow symlinks. So no entry — however
// its path or the symlinks before it are crafted — can touch anything
// outside the layer directory.
type unpacker struct {
	rootFd int
	log    *slog.Logger
	// charge accounts bytes about to be written (content, plus entryCost
	// per entry); an error stops the unpack.
	charge func(int64) error
	dirs   []dirTime // directory times, applied after all entries are written
	buf    []byte
}

type dirTime struct {
	rel   string
	times [2]unix.Timespec
}

// unpackLayer writes the layer tar stream r into dir, which must exist and
// be empty. A hostile entry (absolute name, "..", hardlink out of the
// layer) fails the whole layer with an error wrapping errdefs.ErrInvalid.
// Every byte is charged before it is written (a sparse file's holes are
// written as data, so they count), and charge's error ends the unpack.
func unpackLayer(ctx context.Context, r io.Reader, dir string, charge func(int64) error, log *slog.Logger) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open layer dir %s: %w", dir, err)
	}
	defer unix.Close(fd)
	u := &unpacker{rootFd: fd, log: log, charge: charge, buf: make([]byte, 128<<10)}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := u.charge(entryCost + paxBytes(hdr)); err != nil {
			return err
		}
		if err := u.entry(hdr, tr); err != nil {
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	// Creating children bumps a directory's mtime, so directory times go
	// last, deepest first.
	for i := len(u.dirs) - 1; i >= 0; i-- {
		if err := u.setDirTime(u.dirs[i]); err != nil {
			return fmt.Errorf("set times on %q: %w", u.dirs[i].rel, err)
		}
	}
	return nil
}

// paxBytes is the size of an entry's PAX records, which may become xattrs.
func paxBytes(hdr *tar.Header) int64 {
	var n int64
	for k, v := range hdr.PAXRecords {
		n += int64(len(k) + len(v))
	}
	return n
}

// cleanName validates an archive path and returns it relative to the layer
// root ("." for the root itself). Absolute paths and any ".." component are
// refused rather than clamped: a layer that carries them is broken or
// hostile.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("empty name: %w", errdefs.ErrInvalid)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("absolute path %q: %w", name, errdefs.ErrInvalid)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("path traversal %q: %w", name, errdefs.ErrInvalid)
		}
	}
	return path.Clean(name), nil
}

func splitRel(rel string) (dir, base string) {
	dir, base = path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	return dir, base
}

// openDir opens rel as a directory, resolving every symlink as if the layer
// root were "/" so the result is always inside the layer.
func (u *unpacker) openDir(rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	}
	for {
		fd, err := unix.Openat2(u.rootFd, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// mkdirAll opens directory rel, creating missing components (mode 0755,
// owned by root) the way tar does for entries whose parents were omitted.
func (u *unpacker) mkdirAll(rel string) (int, error) {
	fd, err := u.openDir(rel)
	if err == nil || !errors.Is(err, unix.ENOENT) {
		return fd, err
	}
	parent, err := u.openDir(".")
	if err != nil {
		return -1, err
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		p := strings.Join(comps[:i+1], "/")
		fd, err := u.openDir(p)
		if errors.Is(err, unix.ENOENT) {
			if err := unix.Mkdirat(parent, c, 0o755); err != nil {
				unix.Close(parent)
				return -1, fmt.Errorf("mkdir %s: %w", p, err)
			}
			if err := unix.Fchmodat(parent, c, 0o755, 0); err != nil {
				unix.Close(parent)
				return -1, fmt.Errorf("chmod %s: %w", p, err)
			}
			fd, err = u.openDir(p)
		}
		unix.Close(parent)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", p, err)
		}
		parent = fd
	}
	return parent, nil
}

// entry applies one tar header (and its body, read from r).
func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("layer root is not a directory: %w", errdefs.ErrInvalid)
		}
		return u.meta(u.rootFd, ".", ".", hdr)
	}
	dirRel, base := splitRel(rel)

	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(dirRel, base)
	}

	pfd, err := u.mkdirAll(dirRel)
	if err != nil {
		return fmt.Errorf("parent %s: %w", dirRel, err)
	}
	defer unix.Close(pfd)

	keepDir, err := u.clearTarget(pfd, base, hdr.Typeflag)
	if err != nil {
		return err
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		if !keepDir {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return fmt.Errorf("mkdir: %w", err)
			}
		}
	case tar.TypeReg, tar.TypeGNUSparse: // archive/tar reports legacy TypeRegA entries as TypeReg
		if err := u.writeFile(pfd, base, r); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("symlink: %w", err)
		}
	case tar.TypeLink:
		// A hardlink shares its target's inode and so its metadata; the
		// header's own metadata is a copy and is not applied.
		return u.hardlink(pfd, base, hdr.Linkname)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		mode := uint32(hdr.Mode & 0o7777)
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode |= unix.S_IFCHR
		case tar.TypeBlock:
			mode |= unix.S_IFBLK
		default:
			mode |= unix.S_IFIFO
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, mode, int(dev)); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
	default:
		u.log.Warn("unpack: skipping unsupported tar entry", "name", hdr.Name, "type", strconv.Quote(string(hdr.Typeflag)))
		return nil
	}
	return u.meta(pfd, base, rel, hdr)
}

// clearTarget removes whatever already sits at base so the entry replaces
// it, as a later tar entry does. An existing directory is kept (and
// reported) when the new entry is also a directory.
func (u *unpacker) clearTarget(pfd int, base string, typ byte) (keepDir bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat: %w", err)
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if isDir && typ == tar.TypeDir {
		return true, nil
	}
	if !isDir {
		if err := unix.Unlinkat(pfd, base, 0); err != nil {
			return false, fmt.Errorf("replace: %w", err)
		}
		return false, nil
	}
	if err := u.removeAllAt(pfd, base); err != nil {
		return false, fmt.Errorf("replace dir: %w", err)
	}
	return false, nil
}

// removeAllAt removes directory base under pfd recursively without
// following symlinks.
func (u *unpacker) removeAllAt(pfd int, base string) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	names, err := readDirNames(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Close(fd)
			return err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = u.removeAllAt(fd, n)
		} else {
			err = unix.Unlinkat(fd, n, 0)
		}
		if err != nil {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	return unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
}

func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, 8192)
	var names []string
	for {
		n, err := unix.ReadDirent(dup, buf)
		if err != nil {
			unix.Close(dup)
			return nil, err
		}
		if n == 0 {
			break
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
	unix.Close(dup)
	return names, nil
}

// whiteout translates an OCI whiteout entry into overlayfs form: an opaque
// marker becomes trusted.overlay.opaque=y on its directory, and .wh.<name>
// becomes a 0/0 character device named <name>.
func (u *unpacker) whiteout(dirRel, base string) error {
	if base != opaqueMarker && strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	pfd, err := u.mkdirAll(dirRel)
	if err != nil {
		return fmt.Errorf("parent %s: %w", dirRel, err)
	}
	defer unix.Close(pfd)
	if base == opaqueMarker {
		if err := unix.Fsetxattr(pfd, opaqueXattr, []byte("y"), 0); err != nil {
			return fmt.Errorf("mark opaque: %w", err)
		}
		return nil
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("bad whiteout %q: %w", base, errdefs.ErrInvalid)
	}
	// A whiteout hides only lower layers; an entry of this layer with the
	// same name already hides them and wins.
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return nil
	}
	if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
		return fmt.Errorf("whiteout %s: %w", name, err)
	}
	return nil
}

func (u *unpacker) writeFile(pfd int, base string, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	w := meteredWriter{w: fdWriter(fd), charge: u.charge}
	_, err = io.CopyBuffer(w, r, u.buf)
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// meteredWriter charges every write before making it.
type meteredWriter struct {
	w      io.Writer
	charge func(int64) error
}

func (m meteredWriter) Write(p []byte) (int, error) {
	if err := m.charge(int64(len(p))); err != nil {
		return 0, err
	}
	return m.w.Write(p)
}

// fdWriter writes to a raw fd, retrying short writes.
type fdWriter int

func (f fdWriter) Write(p []byte) (int, error) {
	total := 0
	for total < len(p) {
		n, err := unix.Write(int(f), p[total:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// hardlink links base to an earlier entry of the same layer. The target's
// directory is resolved inside the layer and its last component is linked
// as-is (a symlink target links the symlink, never what it points to).
func (u *unpacker) hardlink(pfd int, base, linkname string) error {
	target, err := cleanName(linkname)
	if err != nil {
		return fmt.Errorf("hardlink target: %w", err)
	}
	if target == "." {
		return fmt.Errorf("hardlink to layer root: %w", errdefs.ErrInvalid)
	}
	tdir, tbase := splitRel(target)
	tfd, err := u.openDir(tdir)
	if err != nil {
		return fmt.Errorf("hardlink target %s: %w", target, err)
	}
	defer unix.Close(tfd)
	if err := unix.Linkat(tfd, tbase, pfd, base, 0); err != nil {
		return fmt.Errorf("hardlink to %s: %w", target, err)
	}
	return nil
}

// meta applies ownership, mode, xattrs and times, in that order: chown
// clears setuid bits and file capabilities, so mode and xattrs follow it.
// Directory times are deferred until the whole layer is written.
func (u *unpacker) meta(pfd int, base, rel string, hdr *tar.Header) error {
	symlink := hdr.Typeflag == tar.TypeSymlink
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if !symlink {
		if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if err := u.xattrs(pfd, base, hdr); err != nil {
		return err
	}
	mtime := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	atime := mtime
	if !hdr.AccessTime.IsZero() {
		atime = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	times := [2]unix.Timespec{atime, mtime}
	if hdr.Typeflag == tar.TypeDir {
		u.dirs = append(u.dirs, dirTime{rel: rel, times: times})
		return nil
	}
	if err := unix.UtimesNanoAt(pfd, base, times[:], unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func (u *unpacker) setDirTime(d dirTime) error {
	if d.rel == "." {
		return unix.UtimesNanoAt(u.rootFd, ".", d.times[:], 0)
	}
	dirRel, base := splitRel(d.rel)
	pfd, err := u.openDir(dirRel)
	if errors.Is(err, unix.ENOENT) {
		return nil // replaced by a later entry
	}
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	err = unix.UtimesNanoAt(pfd, base, d.times[:], unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// xattrs applies SCHILY.xattr.* PAX records. trusted.overlay.* from the
// image is dropped: only the unpacker may speak to overlayfs, or a layer
// could forge whiteouts, opaque dirs or redirects.
func (u *unpacker) xattrs(pfd int, base string, hdr *tar.Header) error {
	if len(hdr.PAXRecords) == 0 {
		return nil
	}
	p := "/proc/self/fd/" + strconv.Itoa(pfd) + "/" + base
	if base == "." {
		p = "/proc/self/fd/" + strconv.Itoa(pfd)
	}
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattrPrefix)
		if !ok {
			continue
		}
		if strings.HasPrefix(name, "trusted.overlay.") {
			u.log.Warn("unpack: dropping overlay xattr from image", "name", hdr.Name, "xattr", name)
			continue
		}
		if err := unix.Lsetxattr(p, name, []byte(v), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) || (errors.Is(err, unix.EPERM) && strings.HasPrefix(name, "user.")) {
				u.log.Warn("unpack: xattr not supported here", "name", hdr.Name, "xattr", name, "err", err)
				continue
			}
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	return nil
}

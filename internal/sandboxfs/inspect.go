package sandboxfs

import (
	"context"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Inspection of a tree as stored, not as the sandbox resolves it: for
// walking a layer or upper dir entry by entry (Diff). No symlink is
// followed anywhere in the name — a symlink among its parents fails with
// ELOOP — so a walk racing a running sandbox that swaps a directory for a
// symlink still never leaves the tree.

// Lstat returns the status of name itself.
func (t *Tree) Lstat(name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := t.resolveStored(clean(name), unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return st, pathErr("lstat", name, err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return st, pathErr("lstat", name, err)
	}
	return st, nil
}

// ReadDir lists directory name, in directory order.
func (t *Tree) ReadDir(name string) ([]fs.DirEntry, error) {
	fd, err := t.resolveStored(clean(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return nil, pathErr("readdir", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, pathErr("readdir", name, err)
	}
	return ents, nil
}

// Readlink returns the target of symlink name.
func (t *Tree) Readlink(name string) (string, error) {
	fd, err := t.resolveStored(clean(name), unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return "", pathErr("readlink", name, err)
	}
	defer unix.Close(fd)
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return "", pathErr("readlink", name, err)
	}
	return string(buf[:n]), nil
}

// DirXattr reads extended attribute attr of directory name into buf and
// returns its length; a name that is not a directory fails with ENOTDIR.
func (t *Tree) DirXattr(name, attr string, buf []byte) (int, error) {
	fd, err := t.resolveStored(clean(name), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
	if err != nil {
		return 0, pathErr("getxattr", name, err)
	}
	defer unix.Close(fd)
	n, err := unix.Fgetxattr(fd, attr, buf)
	if err != nil {
		return 0, pathErr("getxattr", name, err)
	}
	return n, nil
}

// resolveStored opens rel with flags, refusing symlinks on the way.
func (t *Tree) resolveStored(rel string, flags uint64) (int, error) {
	return t.openat2(rel, flags, unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_XDEV)
}

// OpenEntry opens name for reading if it is, as stored, a regular file.
func (t *Tree) OpenEntry(name string) (*os.File, error) {
	pfd, err := t.resolveStored(clean(name), unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	defer unix.Close(pfd)
	return reopenRegular(pfd, name)
}

// ReadEntry returns the contents of name if it is, as stored, a regular
// file of at most max bytes (ErrTooLarge past it), within OpTimeout.
func (t *Tree) ReadEntry(ctx context.Context, name string, max int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, OpTimeout)
	defer cancel()
	f, err := t.OpenEntry(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readCapped(ctx, f, name, max)
}

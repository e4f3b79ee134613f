package agent

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// File error kinds in the protocol's error body (spec §7.2).
const (
	errKindFileNotFound     = "FileNotFound"
	errKindReadError        = "ReadError"
	errKindWriteError       = "WriteError"
	errKindPermissionDenied = "PermissionDenied"
	errKindInvalid          = "InvalidRequest"
)

// FileInfo is the body of GET /v1/stat.
type FileInfo struct {
	Path  string      `json:"path"`
	Size  int64       `json:"size"`
	Mode  fs.FileMode `json:"mode"` // permission bits only
	IsDir bool        `json:"is_dir"`
	MTime time.Time   `json:"mtime"`
}

// cleanPath makes a request path absolute and clean, a relative one
// resolved against base (absolute). The agent's root is the sandbox root,
// so ".." cannot leave it.
func cleanPath(p, base string) (string, error) {
	if p == "" {
		return "", errors.New("path is required")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(base, p)
	}
	return filepath.Join("/", p), nil
}

// errNotRegular is a read of something that is not a plain file on disk:
// a device, FIFO or socket, or a file of a kernel pseudo-filesystem (proc,
// sysfs), whose size and validators mean nothing.
var errNotRegular = errors.New("not a regular file")

// pseudoFSMagic are the statfs types of kernel-generated filesystems.
var pseudoFSMagic = map[int64]string{
	unix.PROC_SUPER_MAGIC: "proc", unix.SYSFS_MAGIC: "sysfs", unix.DEBUGFS_MAGIC: "debugfs",
	unix.TRACEFS_MAGIC: "tracefs", unix.CGROUP_SUPER_MAGIC: "cgroup", unix.CGROUP2_SUPER_MAGIC: "cgroup2",
	unix.SECURITYFS_MAGIC: "securityfs", unix.BPF_FS_MAGIC: "bpf",
}

// fileRequest is the path and identity of a file request: ?path= and
// ?user= (the sandbox's run_config.user; empty means the agent's own). A
// relative path resolves where that user's commands start without a
// work_dir (identity.startDir); the daemon resolves it against a work_dir.
func (s *Server) fileRequest(r *http.Request) (string, identity, error) {
	q := r.URL.Query()
	id, err := lookupIdentity(s.root, q.Get("user"))
	if err != nil {
		return "", identity{}, fmt.Errorf("run_config.user: %w", err)
	}
	p, err := cleanPath(q.Get("path"), id.startDir())
	if err != nil {
		return "", identity{}, err
	}
	return p, id, nil
}

// openRegular opens p for reading as id; anything but a regular file on a
// disk filesystem is errNotRegular (opened non-blocking, so a FIFO cannot
// hang the request).
func openRegular(id identity, p string) (*os.File, error) {
	var fd int
	err := asUser(id, func() error {
		r, err := lookup(id.uid, p, lookupOpts{followLast: true})
		if err != nil {
			return err
		}
		defer r.close()
		fd, err = unix.Openat(r.dir, r.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	var sfs unix.Statfs_t
	err = unix.Fstat(fd, &st)
	if err == nil {
		err = unix.Fstatfs(fd, &sfs)
	}
	switch {
	case err != nil:
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		err = fmt.Errorf("%s %w", p, errIsDir)
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = fmt.Errorf("%s: %w", p, errNotRegular)
	case pseudoFSMagic[int64(sfs.Type)] != "":
		err = fmt.Errorf("%s: %w (a %s file)", p, errNotRegular, pseudoFSMagic[int64(sfs.Type)])
	default:
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), p), nil
}

// handleReadFile serves GET and HEAD /v1/files?path=&user=: the file streams
// from disk through http.ServeContent, whose strong ETag and Last-Modified
// make Range, If-Range, If-None-Match, 206, 304 and 416 work.
func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	path, id, err := s.fileRequest(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindReadError, err.Error())
		return
	}
	f, err := openRegular(id, path)
	if err != nil {
		writeFSError(w, errKindReadError, path, err)
		return
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		writeFSError(w, errKindReadError, path, err)
		return
	}
	w.Header().Set("ETag", etag(st))
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", st.ModTime(), f)
}

// etag is a strong validator: size, mtime in ns and inode change whenever the
// content may have (an upload renames a new inode into place).
func etag(st os.FileInfo) string {
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	return fmt.Sprintf(`"%x-%x-%x"`, st.Size(), st.ModTime().UnixNano(), ino)
}

// handleWriteFile serves PUT /v1/files?path=&mode=&user=: the body streams
// into a temporary file beside the target, which is then renamed over it,
// so readers never see a partial file. Missing parents are created 0755.
func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	path, id, err := s.fileRequest(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindWriteError, err.Error())
		return
	}
	mode := fs.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			writeError(w, http.StatusBadRequest, errKindWriteError, fmt.Sprintf("invalid mode %q", m))
			return
		}
		mode = fs.FileMode(n)
	}
	if err := writeFileAtomic(id, path, mode, r.Body); err != nil {
		writeFSError(w, errKindWriteError, path, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeFileAtomic writes body to path as id. Path lookups, the temporary
// file's creation and the rename run as id; copying the body writes only to
// the already-open file.
func writeFileAtomic(id identity, path string, mode fs.FileMode, body io.Reader) error {
	var r resolved
	var tmp *os.File
	tmpName := ".cubicle-upload-" + rand.Text()
	err := asUser(id, func() error {
		var err error
		if r, err = lookup(id.uid, path, lookupOpts{mkdirs: true}); err != nil {
			return err
		}
		var st unix.Stat_t
		if unix.Fstatat(r.dir, r.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			return fmt.Errorf("%s %w", path, errIsDir)
		}
		fd, err := unix.Openat(r.dir, tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		tmp = os.NewFile(uintptr(fd), tmpName)
		return nil
	})
	if r.name != "" {
		defer r.close()
	}
	if err != nil {
		return err
	}
	_, err = io.Copy(tmp, uploadBody{body})
	return asUser(id, func() error {
		if err == nil {
			err = tmp.Chmod(mode) // explicit, so the umask does not apply
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = unix.Renameat(r.dir, tmpName, r.dir, r.name)
		}
		if err != nil {
			unix.Unlinkat(r.dir, tmpName, 0)
		}
		return err
	})
}

var errIsDir = errors.New("is a directory")

// errUploadBody is a failure to read an upload's body: the sender's side
// (a cut connection, a body over a limit), not the sandbox's.
var errUploadBody = errors.New("read upload body")

// uploadBody marks its reader's errors as errUploadBody.
type uploadBody struct{ r io.Reader }

func (b uploadBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("%w: %w", errUploadBody, err)
	}
	return n, err
}

// handleStat serves GET /v1/stat?path=&user=.
func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) {
	path, id, err := s.fileRequest(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindInvalid, err.Error())
		return
	}
	fi, err := statAs(id, path)
	if err != nil {
		writeFSError(w, errKindReadError, path, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

// statAs describes path as id sees it, following a final symlink under the
// symlink rule.
func statAs(id identity, path string) (FileInfo, error) {
	var st unix.Stat_t
	err := asUser(id, func() error {
		r, err := lookup(id.uid, path, lookupOpts{followLast: true})
		if err != nil {
			return err
		}
		defer r.close()
		return unix.Fstatat(r.dir, r.name, &st, unix.AT_SYMLINK_NOFOLLOW)
	})
	if err != nil {
		return FileInfo{}, err
	}
	return FileInfo{Path: path, Size: st.Size, Mode: fs.FileMode(st.Mode).Perm(), IsDir: st.Mode&unix.S_IFMT == unix.S_IFDIR,
		MTime: time.Unix(st.Mtim.Unix()).UTC()}, nil
}

// writeFSError maps a filesystem error to the protocol's error body. What
// the request or the sandbox's files caused is a 4xx: missing → 404,
// permission or a refused symlink → 403, a directory, not a regular file
// or a broken upload body → 400, no space or quota → 413, busy or in use → 409. Only the rest
// (I/O errors, ...) is a 500.
func writeFSError(w http.ResponseWriter, kind, path string, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, fs.ErrNotExist), kind == errKindReadError && errors.Is(err, syscall.ENOTDIR):
		writeError(w, http.StatusNotFound, errKindFileNotFound, "file not found: "+path)
		return
	case errors.Is(err, errSymlinkEscape), errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		writeError(w, http.StatusForbidden, errKindPermissionDenied, err.Error())
		return
	case errors.Is(err, errIsDir), errors.Is(err, errNotRegular), errors.Is(err, errUploadBody), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL),
		errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.ENODEV), errors.Is(err, syscall.EXDEV):
		status = http.StatusBadRequest
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		status = http.StatusRequestEntityTooLarge
	case errors.Is(err, syscall.EBUSY), errors.Is(err, syscall.ETXTBSY), errors.Is(err, syscall.EEXIST), errors.Is(err, syscall.ENOTEMPTY):
		status = http.StatusConflict
	}
	writeError(w, status, kind, err.Error())
}

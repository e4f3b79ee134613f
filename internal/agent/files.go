package agent

import (
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

// cleanPath makes a request path absolute and clean. Relative paths resolve
// against "/": the agent's root is the sandbox root, so nothing escapes it.
func cleanPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("path is required")
	}
	return filepath.Join("/", p), nil
}

// handleReadFile serves GET and HEAD /v1/files?path=: the file streams from
// disk through http.ServeContent, whose strong ETag and Last-Modified make
// Range, If-Range, If-None-Match, 206, 304 and 416 work.
func (s *Server) handleReadFile(w http.ResponseWriter, r *http.Request) {
	path, err := cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindInvalid, err.Error())
		return
	}
	f, err := os.Open(path)
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
	if st.IsDir() {
		writeError(w, http.StatusBadRequest, errKindReadError, path+" is a directory")
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

// handleWriteFile serves PUT /v1/files?path=&mode=: the body streams into a
// temporary file beside the target, which is then renamed over it, so
// readers never see a partial file. Missing parents are created 0755.
func (s *Server) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	path, err := cleanPath(q.Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindWriteError, err.Error())
		return
	}
	mode := fs.FileMode(0o644)
	if m := q.Get("mode"); m != "" {
		n, err := strconv.ParseUint(m, 8, 32)
		if err != nil || n > 0o7777 {
			writeError(w, http.StatusBadRequest, errKindWriteError, fmt.Sprintf("invalid mode %q", m))
			return
		}
		mode = fs.FileMode(n)
	}
	if err := writeFileAtomic(path, mode, r.Body); err != nil {
		writeFSError(w, errKindWriteError, path, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func writeFileAtomic(path string, mode fs.FileMode, body io.Reader) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%s is a directory: %w", path, errIsDir)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".cubicle-upload-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	_, err = io.Copy(tmp, body)
	if err == nil {
		err = tmp.Chmod(mode) // explicit, so the umask does not apply
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

var errIsDir = errors.New("is a directory")

// handleStat serves GET /v1/stat?path=.
func (s *Server) handleStat(w http.ResponseWriter, r *http.Request) {
	path, err := cleanPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, http.StatusBadRequest, errKindInvalid, err.Error())
		return
	}
	st, err := os.Stat(path)
	if err != nil {
		writeFSError(w, errKindReadError, path, err)
		return
	}
	writeJSON(w, http.StatusOK, FileInfo{Path: path, Size: st.Size(), Mode: st.Mode().Perm(), IsDir: st.IsDir(), MTime: st.ModTime().UTC()})
}

// writeFSError maps a filesystem error to the protocol's error body: missing
// → 404 FileNotFound, permission → 403, directory → 400, else 500 kind.
func writeFSError(w http.ResponseWriter, kind, path string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist), kind == errKindReadError && errors.Is(err, syscall.ENOTDIR):
		writeError(w, http.StatusNotFound, errKindFileNotFound, "file not found: "+path)
	case errors.Is(err, fs.ErrPermission):
		writeError(w, http.StatusForbidden, errKindPermissionDenied, err.Error())
	case errors.Is(err, errIsDir), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR):
		writeError(w, http.StatusBadRequest, kind, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, kind, err.Error())
	}
}

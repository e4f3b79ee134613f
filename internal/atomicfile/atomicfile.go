// Package atomicfile writes the daemon's own files (sandbox and network
// records, signing and encryption keys, the secrets vault, image refs and
// records) so that a crash never leaves one torn, empty or half-written.
//
// The fsync rule, the same for every such file: the content is fsynced
// before the file takes its name (by rename or link), and the directory
// after. So until a call returns the path holds the old content (or
// nothing), and once it returns nil the new content survives a power loss.
//
// Files in a sandbox's tree are not written here: internal/sandboxfs does
// that, resolving every path inside the tree so the sandbox's symlinks
// cannot redirect a write.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
)

// Option adjusts a write.
type Option func(*config)

type config struct{ tempDir string }

// WithTempDir stages the file in dir (on path's filesystem) instead of
// beside path: for a directory that is listed, where a staging file left
// by a crash must not show up as an entry.
func WithTempDir(dir string) Option { return func(c *config) { c.tempDir = dir } }

func newConfig(path string, opts []Option) config {
	c := config{tempDir: filepath.Dir(path)}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WriteFile replaces path with data, mode perm (umask not applied).
func WriteFile(path string, data []byte, perm fs.FileMode, opts ...Option) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}, opts...)
}

// Write replaces path with what fill writes, mode perm (umask not
// applied). An error from fill leaves path as it was.
func Write(path string, perm fs.FileMode, fill func(io.Writer) error, opts ...Option) error {
	c := newConfig(path, opts)
	pf, err := renameio.NewPendingFile(path, renameio.WithTempDir(c.tempDir), renameio.WithStaticPermissions(perm))
	if err != nil {
		return fmt.Errorf("stage %s: %w", path, err)
	}
	defer pf.Cleanup()
	if err := fill(pf); err != nil {
		return err
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// Create writes data to path, mode perm, only if path does not exist:
// created is false (and err nil) when it already did. The file appears
// whole (it is linked into place once written and synced), so a racing
// Create or reader sees no file or the complete one, never a prefix.
func Create(path string, data []byte, perm fs.FileMode, opts ...Option) (created bool, err error) {
	c := newConfig(path, opts)
	f, err := os.CreateTemp(c.tempDir, "."+filepath.Base(path)+".new-*")
	if err != nil {
		return false, fmt.Errorf("stage %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if err := errors.Join(err, f.Close()); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(tmp, path); errors.Is(err, fs.ErrExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("create %s: %w", path, err)
	}
	return true, SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs directory dir, making the creation, rename or removal of
// an entry in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

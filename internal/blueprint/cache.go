package blueprint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
)

// The built cache keeps finished builds under <CacheDir>/built: KEY.tar,
// the root filesystem tarball of the recipe with that key, and KEY.json,
// its digest and packages, written last (an entry without it does not
// exist). A daemon on fresh data, or a stacked recipe whose base was
// built before, takes the tarball instead of building it again. Entries
// are checked against their digest when taken, and the least recently
// used beyond keepBuilt are removed. A recipe's key pins its packages by
// name, not version: an entry older than maxBuiltAge is built again, so
// the archive's (security) updates reach new builds within that time.
const (
	keepBuilt   = 6
	maxBuiltAge = 7 * 24 * time.Hour
)

// builtEntry is KEY.json.
type builtEntry struct {
	SHA256   string            `json:"sha256"`
	Packages map[string]string `json:"packages"`
}

func (b *Builder) builtDir() string {
	if b.CacheDir == "" {
		return ""
	}
	return filepath.Join(b.CacheDir, "built")
}

// lookupBuilt is the cached tarball of key and its packages; ok is false
// when there is none, or when it no longer matches its digest (it is then
// removed, and the recipe is built again).
func (b *Builder) lookupBuilt(key string) (tarball string, pkgs map[string]string, ok bool) {
	dir := b.builtDir()
	if dir == "" {
		return "", nil, false
	}
	meta, tarball := filepath.Join(dir, key+".json"), filepath.Join(dir, key+".tar")
	data, err := os.ReadFile(meta)
	if err != nil {
		return "", nil, false
	}
	var e builtEntry
	err = json.Unmarshal(data, &e)
	if fi, serr := os.Stat(tarball); err == nil && serr == nil && time.Since(fi.ModTime()) > maxBuiltAge {
		err = fmt.Errorf("built %s ago, more than %s", time.Since(fi.ModTime()).Round(time.Hour), maxBuiltAge)
	}
	if err == nil {
		var sum string
		if sum, err = fileSHA256(tarball); err == nil && sum != e.SHA256 {
			err = fmt.Errorf("tarball digest %s, want %s", sum, e.SHA256)
		}
	}
	if err != nil {
		if b.Log != nil {
			b.Log.Info("dropping a built-cache entry", "key", key, "why", err)
		}
		os.Remove(meta)
		os.Remove(tarball)
		return "", nil, false
	}
	now := time.Now()
	_ = os.Chtimes(meta, now, now) // the most recently used: pruned last
	return tarball, e.Packages, true
}

// keepBuilt moves tarball (the finished build of key) into the built
// cache and returns where it now is ("" when there is no cache).
func (b *Builder) keepBuilt(key, tarball string, pkgs map[string]string) (string, error) {
	dir := b.builtDir()
	if dir == "" {
		return "", nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("built cache: %w", err)
	}
	dst := filepath.Join(dir, key+".tar")
	if err := moveFile(tarball, dst); err != nil {
		return "", fmt.Errorf("keep %s in the built cache: %w", key, err)
	}
	sum, err := fileSHA256(dst)
	if err != nil {
		return "", err
	}
	data, err := json.Marshal(builtEntry{SHA256: sum, Packages: pkgs})
	if err != nil {
		return "", err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, key+".json"), data, 0o600); err != nil {
		return "", fmt.Errorf("keep %s in the built cache: %w", key, err)
	}
	b.pruneBuilt(dir)
	return dst, nil
}

// pruneBuilt removes the entries used least recently beyond keepBuilt,
// and old tarballs no entry names (a build cut off between the two
// writes).
func (b *Builder) pruneBuilt(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type entry struct {
		key  string
		used time.Time
	}
	var metas []entry
	tars := map[string]bool{}
	for _, de := range ents {
		name := de.Name()
		if key, ok := strings.CutSuffix(name, ".json"); ok {
			if fi, err := de.Info(); err == nil {
				metas = append(metas, entry{key, fi.ModTime()})
			}
		} else if key, ok := strings.CutSuffix(name, ".tar"); ok {
			// Another daemon sharing the cache may be between its two
			// writes: only an orphan older than any build is removed.
			if fi, err := de.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
				tars[key] = true
			}
		}
	}
	slices.SortFunc(metas, func(a, b entry) int { return b.used.Compare(a.used) })
	for i, m := range metas {
		if i < keepBuilt {
			delete(tars, m.key)
			continue
		}
		os.Remove(filepath.Join(dir, m.key+".json"))
		os.Remove(filepath.Join(dir, m.key+".tar"))
		delete(tars, m.key)
	}
	for key := range tars {
		os.Remove(filepath.Join(dir, key+".tar"))
	}
}

// fileSHA256 is the hex sha256 of path's content.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("digest %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// moveFile renames src to dst, or copies it (then removes src) when they
// are on different filesystems; dst appears whole or not at all.
func moveFile(src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, syscall.EXDEV) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	err = atomicfile.Write(dst, 0o600, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
	if err != nil {
		return err
	}
	return os.Remove(src)
}

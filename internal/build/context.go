package build

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
)

// ExtractContext unpacks the build context tar r (at most maxBytes) into
// dir and applies its .dockerignore: what it excludes is removed, so no
// step can read it. It returns the Dockerfile the context holds at
// "Dockerfile", if any, read before .dockerignore applies (as Docker
// does: ignoring the Dockerfile keeps it out of COPY, not out of the
// build).
func ExtractContext(dir string, r io.Reader, maxBytes int64) (dockerfile []byte, err error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open build context dir: %w", err)
	}
	defer root.Close()
	lr := &io.LimitedReader{R: r, N: maxBytes + 1}
	if err := untar(root, lr, ".", owner{uid: -1, gid: -1}, maxBytes); err != nil {
		if lr.N <= 0 || errors.Is(err, errTooBig) {
			return nil, errdefs.Field("context", "is over %d bytes", maxBytes)
		}
		return nil, errdefs.Field("context", "not a tar archive: %v", err)
	}
	if lr.N <= 0 {
		return nil, errdefs.Field("context", "is over %d bytes", maxBytes)
	}
	dockerfile, err = root.ReadFile("Dockerfile")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read the context's Dockerfile: %w", err)
	}
	if err := applyDockerignore(root); err != nil {
		return nil, err
	}
	return dockerfile, nil
}

// applyDockerignore removes what the context's .dockerignore excludes.
func applyDockerignore(root *os.Root) error {
	f, err := root.Open(".dockerignore")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read .dockerignore: %w", err)
	}
	patterns, err := ignorefile.ReadAll(f)
	f.Close()
	if err != nil {
		return errdefs.Field("context", ".dockerignore: %v", err)
	}
	pm, err := patternmatcher.New(patterns)
	if err != nil {
		return errdefs.Field("context", ".dockerignore: %v", err)
	}
	var drop []string
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		ignored, err := pm.MatchesOrParentMatches(filepath.ToSlash(p))
		if err != nil {
			return err
		}
		switch {
		case !ignored:
		case d.IsDir() && !pm.Exclusions():
			// Nothing under it can be re-included by a "!" pattern.
			drop = append(drop, p)
			return fs.SkipDir
		case !d.IsDir():
			drop = append(drop, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("apply .dockerignore: %w", err)
	}
	for _, p := range drop {
		if err := root.RemoveAll(p); err != nil {
			return fmt.Errorf("apply .dockerignore: %w", err)
		}
	}
	return nil
}

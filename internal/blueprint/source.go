package blueprint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Source makes a built-in snapshot by building Recipe and importing the
// result into Images.
type Source struct {
	Builder *Builder
	Recipe  Recipe
	Images  *image.Store
}

var _ sandbox.BuiltinSource = (*Source)(nil)

// Key is the recipe's.
func (s *Source) Key() string { return s.Recipe.Key() }

// Describe names the blueprint and its suite.
func (s *Source) Describe() string {
	return fmt.Sprintf("blueprint %s (Debian %s, %s)", s.Recipe.Name, s.Recipe.Suite, s.Recipe.Key())
}

// Boot is the recipe's (sandbox.BuiltinBooter).
func (s *Source) Boot() sandbox.BuiltinBoot { return s.Recipe.Boot }

var _ sandbox.BuiltinBooter = (*Source)(nil)

// imageRef is the local image name a built-in of this key gets.
func imageRef(name, key string) string { return "cubicle-builtin/" + name + ":" + key }

// Make builds the recipe (0–97%) and imports the root filesystem.
func (s *Source) Make(ctx context.Context, ws string, progress func(string, int)) (*image.Image, map[string]string, error) {
	res, err := s.Builder.Build(ctx, s.Recipe, func(p Progress) { progress(p.Step, p.Percent) })
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(res.Dir)
	progress("importing the root filesystem", 97)
	r := s.Recipe
	cfg := v1.Config{User: r.User, WorkingDir: r.Home(), Env: r.Env, Cmd: []string{"/bin/bash"}}
	img, err := s.Images.ImportRootfs(ctx, ws, res.Rootfs, imageRef(r.Name, r.Key()), cfg)
	if err != nil {
		return nil, nil, err
	}
	if img, _, err = unnamed(ctx, s.Images, ws, img); err != nil {
		return nil, nil, err
	}
	if s.Builder.Log != nil {
		s.Builder.Log.Info("built blueprint", "name", r.Name, "key", r.Key(), "packages", len(res.Packages), "cached", res.Cached, "took", res.Took)
	}
	return img, res.Packages, nil
}

// Imported makes a built-in snapshot from Spec instead of building one: a
// file (a `docker save` tarball, an OCI archive, or a plain root
// filesystem tarball) or else an image reference to pull.
type Imported struct {
	Name   string
	Spec   string
	Images *image.Store
}

var _ sandbox.BuiltinSource = (*Imported)(nil)

// Key is the reference, or for a file its path, size and mtime (so a
// replaced file is imported again).
func (s *Imported) Key() string {
	id := "ref " + s.Spec
	if st, err := os.Stat(s.Spec); err == nil {
		abs, _ := filepath.Abs(s.Spec)
		id = fmt.Sprintf("file %s %d %d", abs, st.Size(), st.ModTime().UnixNano())
	}
	h := sha256.Sum256([]byte(id))
	return hex.EncodeToString(h[:])[:16]
}

// Describe is the spec.
func (s *Imported) Describe() string { return s.Spec }

// Make loads or pulls the image.
func (s *Imported) Make(ctx context.Context, ws string, progress func(string, int)) (*image.Image, map[string]string, error) {
	if _, err := os.Stat(s.Spec); err != nil {
		progress("pulling "+s.Spec, 0)
		img, err := s.Images.Resolve(ctx, ws, s.Spec, nil, func(p image.Progress) {
			if p.Total > 0 {
				progress("pulling "+s.Spec, int(p.Complete*100/p.Total))
			}
		})
		return img, nil, err
	}
	progress("loading "+s.Spec, 0)
	ref := imageRef(s.Name, s.Key())
	imgs, err := s.Images.Load(ctx, ws, s.Spec, ref)
	if errors.Is(err, errdefs.ErrInvalid) {
		// Not an image archive: a root filesystem tarball.
		cfg := v1.Config{Env: Default().Env, WorkingDir: "/", Cmd: []string{"/bin/sh"}}
		img, err := s.Images.ImportRootfs(ctx, ws, s.Spec, ref, cfg)
		if err != nil {
			return nil, nil, err
		}
		return unnamed(ctx, s.Images, ws, img)
	}
	if err != nil {
		return nil, nil, err
	}
	for _, extra := range imgs[1:] {
		extra.Release()
	}
	return unnamed(ctx, s.Images, ws, imgs[0])
}

// unnamed drops the names an import gave img and returns it (as Make
// does): the built-in snapshot that records its layers keeps them (the
// caller's hold until then), and once that snapshot is superseded and
// deleted the next image GC frees them, with no name left behind.
func unnamed(ctx context.Context, images *image.Store, ws string, img *image.Image) (*image.Image, map[string]string, error) {
	if err := images.Remove(ctx, ws, img.Digest); err != nil {
		img.Release()
		return nil, nil, fmt.Errorf("drop the import's name of %s: %w", img.Digest, err)
	}
	return img, nil, nil
}

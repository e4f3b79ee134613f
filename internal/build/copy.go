package build

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
)

// copyOp is a COPY or ADD after expansion.
type copyOp struct {
	sd           instructions.SourcesAndDest
	from         string
	chown, chmod string
	unpack       bool // ADD: a local tar archive is unpacked
}

// copy runs a COPY/ADD step. Its key covers the sources' content: the
// context files it reads (by digest), or the --from stage's key.
func (b *builder) copy(ctx context.Context, s *stageState, op copyOp, fail func(error, string) error) error {
	own, err := parseOwner(op.chown, op.chmod)
	if err != nil {
		return fail(err, "")
	}
	dest := absPath(s.cfg.WorkDir, op.sd.DestPath)
	if strings.HasSuffix(op.sd.DestPath, "/") || op.sd.DestPath == "." {
		dest += "/"
	}
	var srcKey string
	var layers []string // the --from tree, or nil for the context
	if op.from != "" {
		srcKey, layers, err = b.fromSource(ctx, op.from)
		if err != nil {
			return fail(err, "")
		}
	} else {
		root, err := os.OpenRoot(b.o.Context)
		if err != nil {
			return fail(fmt.Errorf("open build context: %w", err), "")
		}
		defer root.Close()
		srcs, err := resolveSources(root, op.sd.SourcePaths)
		if err != nil {
			return fail(err, "")
		}
		if srcKey, err = digestSources(root, srcs); err != nil {
			return fail(err, "")
		}
	}
	key := chain(s.key, "COPY", srcKey, strings.Join(op.sd.SourcePaths, "\x00"), dest, op.chown, op.chmod, strconv.FormatBool(op.unpack))
	return b.layerStep(ctx, s, fail, key, func(ctx context.Context) (Layer, error) {
		srcDir, done := b.o.Context, func() {}
		if op.from != "" {
			if srcDir, done, err = b.w.Open(ctx, layers); err != nil {
				return Layer{}, err
			}
		}
		defer done()
		src, err := os.OpenRoot(srcDir)
		if err != nil {
			return Layer{}, fmt.Errorf("open copy source: %w", err)
		}
		defer src.Close()
		srcs, err := resolveSources(src, op.sd.SourcePaths)
		if err != nil {
			return Layer{}, err
		}
		return b.w.Layer(ctx, func(dst *os.Root) error { return copySources(dst, src, srcs, dest, own, op.unpack) })
	})
}

// fromSource is COPY --from's source: a built stage, else an image or
// snapshot, as its key and layers.
func (b *builder) fromSource(ctx context.Context, from string) (string, []string, error) {
	for i, st := range b.plan.Stages {
		if strconv.Itoa(i) == from || (st.Name != "" && strings.EqualFold(st.Name, from)) {
			if s := b.done[i]; s != nil {
				return s.key, s.layers, nil
			}
		}
	}
	base, err := b.base(ctx, from)
	if err != nil {
		return "", nil, err
	}
	return base.Key, base.Layers, nil
}

// owner is what --chown/--chmod set on copied files (-1: leave).
type owner struct {
	uid, gid int
	mode     fs.FileMode
	setMode  bool
}

func parseOwner(chown, chmod string) (owner, error) {
	o := owner{uid: -1, gid: -1}
	if chown != "" {
		var err error
		if o.uid, o.gid, err = parseChown(chown); err != nil {
			return o, err
		}
	}
	if chmod != "" {
		m, err := strconv.ParseUint(chmod, 8, 32)
		if err != nil || m > 0o7777 {
			return o, fmt.Errorf("--chmod=%s: only an octal mode is supported", chmod)
		}
		o.mode, o.setMode = fs.FileMode(m), true
	}
	return o, nil
}

// resolveSources expands COPY sources (globs included) to paths in root.
func resolveSources(root *os.Root, srcs []string) ([]string, error) {
	var out []string
	for _, s := range srcs {
		p := rel(s)
		if strings.ContainsAny(p, "*?[") {
			m, err := fs.Glob(root.FS(), p)
			if err != nil {
				return nil, fmt.Errorf("source %q: %w", s, err)
			}
			if len(m) == 0 {
				return nil, fmt.Errorf("source %q: no file matches", s)
			}
			out = append(out, m...)
			continue
		}
		if _, err := root.Lstat(p); err != nil {
			return nil, fmt.Errorf("source %q not found in the build context (or excluded by .dockerignore)", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// digestSources digests the files under srcs in root: names, modes,
// symlink targets and contents, so any change to what a COPY reads
// changes its key.
func digestSources(root *os.Root, srcs []string) (string, error) {
	h := sha256.New()
	for _, s := range srcs {
		err := fs.WalkDir(root.FS(), s, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%q %o %d\n", p, info.Mode(), info.Size())
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				t, err := root.Readlink(p)
				if err != nil {
					return err
				}
				io.WriteString(h, t+"\n")
			case info.Mode().IsRegular():
				f, err := root.Open(p)
				if err != nil {
					return err
				}
				_, err = io.Copy(h, f)
				f.Close()
				return err
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("digest build context: %w", err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// copySources copies srcs from src to dest in dst with Docker's rules: a
// directory's contents go into dest; a file goes to dest, or into it when
// dest ends in "/" or there are several sources; with unpack a tar
// archive is unpacked into dest.
func copySources(dst, src *os.Root, srcs []string, dest string, own owner, unpack bool) error {
	intoDir := strings.HasSuffix(dest, "/") || len(srcs) > 1
	d := rel(dest)
	for _, s := range srcs {
		info, err := src.Lstat(s)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			err = copyTree(dst, src, s, d, own)
		case unpack && info.Mode().IsRegular() && isArchive(src, s):
			err = unpackFile(dst, src, s, d, own)
		default:
			t := d
			if intoDir {
				t = path.Join(d, path.Base(s))
			}
			err = copyEntry(dst, src, s, t, info, own)
		}
		if err != nil {
			return fmt.Errorf("copy %s: %w", s, err)
		}
	}
	return nil
}

func copyTree(dst, src *os.Root, from, to string, own owner) error {
	return fs.WalkDir(src.FS(), from, func(p string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := de.Info()
		if err != nil {
			return err
		}
		return copyEntry(dst, src, p, path.Join(to, strings.TrimPrefix(strings.TrimPrefix(p, from), "/")), info, own)
	})
}

// copyEntry copies one file, directory or symlink (other kinds are
// skipped) from src's p to dst's t, creating t's parents.
func copyEntry(dst, src *os.Root, p, t string, info fs.FileInfo, own owner) error {
	if err := dst.MkdirAll(path.Dir(t), 0o755); err != nil {
		return err
	}
	mode := info.Mode().Perm() | info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	switch {
	case info.IsDir():
		if err := dst.MkdirAll(t, 0o755); err != nil {
			return err
		}
	case info.Mode()&fs.ModeSymlink != 0:
		link, err := src.Readlink(p)
		if err != nil {
			return err
		}
		dst.Remove(t)
		if err := dst.Symlink(link, t); err != nil {
			return err
		}
		return chownEntry(dst, t, own, true)
	case info.Mode().IsRegular():
		in, err := src.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		if err := writeFile(dst, t, in); err != nil {
			return err
		}
	default:
		return nil
	}
	return finish(dst, t, mode, own)
}

func writeFile(dst *os.Root, t string, r io.Reader) error {
	out, err := dst.OpenFile(t, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// finish sets t's mode (--chmod wins) and owner.
func finish(dst *os.Root, t string, mode fs.FileMode, own owner) error {
	if own.setMode {
		mode = own.mode
	}
	if err := dst.Chmod(t, mode); err != nil {
		return err
	}
	return chownEntry(dst, t, own, false)
}

func chownEntry(dst *os.Root, t string, own owner, link bool) error {
	if own.uid < 0 {
		return nil
	}
	if link {
		return dst.Lchown(t, own.uid, own.gid)
	}
	return dst.Chown(t, own.uid, own.gid)
}

// isArchive reports whether src's p is a tar archive, plain or gzipped.
func isArchive(src *os.Root, p string) bool {
	f, err := src.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	r, err := decompress(f)
	if err != nil {
		return false
	}
	_, err = tar.NewReader(r).Next()
	return err == nil
}

func decompress(f io.Reader) (io.Reader, error) {
	br := bufio.NewReader(f)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		return gzip.NewReader(br)
	}
	return br, nil
}

func unpackFile(dst, src *os.Root, p, to string, own owner) error {
	f, err := src.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := decompress(f)
	if err != nil {
		return err
	}
	return untar(dst, r, to, own, MaxUnpackBytes)
}

// MaxUnpackBytes bounds what one ADD unpacks from a local archive.
const MaxUnpackBytes = 16 << 30

// untar unpacks the tar stream r under dir in dst: directories, regular
// files, symlinks and hard links; names that would leave dst are refused
// by os.Root. Files may hold at most limit bytes in all (sizes as their
// headers give them, so sparse files count whole).
func untar(dst *os.Root, r io.Reader, dir string, own owner, limit int64) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		name := path.Join(dir, rel(h.Name))
		if name == "." && h.Typeflag != tar.TypeDir {
			continue
		}
		if err := dst.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		mode := fs.FileMode(h.Mode).Perm() | fs.FileMode(h.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
		switch h.Typeflag {
		case tar.TypeDir:
			err = dst.MkdirAll(name, 0o755)
		case tar.TypeReg:
			if limit -= h.Size; limit < 0 {
				return fmt.Errorf("unpack %s: the archive unpacks to too many bytes: %w", h.Name, errTooBig)
			}
			err = writeFile(dst, name, tr)
		case tar.TypeSymlink:
			dst.Remove(name)
			if err = dst.Symlink(h.Linkname, name); err == nil {
				err = chownEntry(dst, name, own, true)
			}
			if err != nil {
				return fmt.Errorf("unpack %s: %w", h.Name, err)
			}
			continue
		case tar.TypeLink:
			dst.Remove(name)
			err = dst.Link(path.Join(dir, rel(h.Linkname)), name)
			if err != nil {
				return fmt.Errorf("unpack %s: %w", h.Name, err)
			}
			continue
		default:
			continue
		}
		if err == nil {
			err = finish(dst, name, mode, own)
		}
		if err != nil {
			return fmt.Errorf("unpack %s: %w", h.Name, err)
		}
	}
}

// errTooBig is an archive that unpacks past its limit.
var errTooBig = errors.New("over the size limit")

// absPath resolves a Dockerfile path against the working directory.
func absPath(workdir, p string) string {
	if !path.IsAbs(p) {
		p = path.Join("/", workdir, p)
	}
	return path.Clean(p)
}

// rel is p as a path inside an os.Root ("." for the root).
func rel(p string) string {
	p = strings.TrimLeft(path.Clean("/"+p), "/")
	if p == "" {
		return "."
	}
	return p
}

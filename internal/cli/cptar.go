package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// Directory copies stream a tar archive through the binary-safe exec: the
// sandbox's own tar packs or unpacks it, running as the sandbox's user
// inside the sandbox, so an archive can only ever reach what that user
// can. Locally, the CLI writes archives with archive/tar and unpacks them
// through an os.Root, which refuses every path (and symlink) leading out
// of the destination. Entries are regular files, directories and symlinks
// (kept as symlinks) with their permission bits; owners are not copied (a
// copy belongs to whoever receives it), nor are devices, FIFOs or sockets
// (refused with an error naming them).

// tarMissing is the exit code of a shell that found no tar.
const tarMissing = 127

// cpDirUpload copies local directory src into the sandbox at dst: into
// dst/<base of src> when dst is an existing directory, else as dst itself.
func cpDirUpload(ctx context.Context, c *cubicle.Client, src string, dst cpArg) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, src)) }()
	defer pr.Close()
	script := fmt.Sprintf(`d=%s; if [ -d "$d" ]; then d="$d"/%s; fi; mkdir -p "$d" && cd "$d" && exec tar -x -p -o -f -`,
		shellQuote(dst.path), shellQuote(filepath.Base(src)))
	return runTar(ctx, c, dst, script, pr, io.Discard)
}

// cpDirDownload copies sandbox directory src to local: into local/<base
// of src> when local is an existing directory, else as local itself.
func cpDirDownload(ctx context.Context, c *cubicle.Client, src cpArg, local string) error {
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(src.path))
	}
	pr, pw := io.Pipe()
	untarred := make(chan error, 1)
	go func() {
		err := readTar(pr, local)
		pr.CloseWithError(err) // a failed unpack stops the stream
		untarred <- err
	}()
	err := runTar(ctx, c, src, "cd "+shellQuote(src.path)+" && exec tar -c -f - .", nil, pw)
	pw.CloseWithError(err)
	if uerr := <-untarred; uerr != nil {
		return fmt.Errorf("unpack into %s: %w", local, uerr)
	}
	return err
}

// runTar runs script (a tar in the sandbox of at) with stdin and stdout.
func runTar(ctx context.Context, c *cubicle.Client, at cpArg, script string, stdin io.Reader, stdout io.Writer) error {
	var stderr bytes.Buffer
	code, err := c.Exec(ctx, at.sandbox, cubicle.ExecRequest{Command: script, Shell: "/bin/sh", Timeout: -1,
		Stdin: stdin, Stdout: stdout, Stderr: &stderr})
	switch {
	case err != nil:
		return err
	case code == tarMissing:
		return fmt.Errorf("%s:%s: directory copies run tar inside the sandbox, and its image has none: %s", at.sandbox, at.path, strings.TrimSpace(stderr.String()))
	case code != 0:
		return fmt.Errorf("%s:%s: tar in the sandbox exited %d: %s", at.sandbox, at.path, code, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// writeTar writes the tree at root as a tar of "./"-relative entries.
func writeTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		return writeTarEntry(tw, p, "./"+filepath.ToSlash(rel), fi)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeTarEntry writes one file of the tree: its header, and its content
// for a regular file.
func writeTarEntry(tw *tar.Writer, p, name string, fi fs.FileInfo) error {
	var link string
	switch fi.Mode().Type() {
	case 0, fs.ModeDir:
	case fs.ModeSymlink:
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%s: cannot copy a %s (only files, directories and symlinks)", p, fi.Mode().Type())
	}
	h, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	h.Name = strings.TrimSuffix(path.Clean(name), "/")
	if fi.IsDir() {
		h.Name += "/"
	}
	h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	return nil
}

// readTar unpacks a tar into dest (created if missing) through an
// os.Root, so no entry lands outside it. Directory modes are applied last,
// so a read-only directory still receives its files.
func readTar(r io.Reader, dest string) error {
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return err
	}
	defer root.Close()
	type dirMode struct {
		name string
		mode fs.FileMode
	}
	var dirs []dirMode
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		mode := fs.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMode{name, mode})
		case tar.TypeReg:
			err = extractFile(root, name, mode, tr)
		case tar.TypeSymlink:
			err = replaceWith(root, name, func() error { return root.Symlink(h.Linkname, name) })
		case tar.TypeLink:
			err = replaceWith(root, name, func() error { return root.Link(path.Clean(strings.TrimPrefix(h.Linkname, "/")), name) })
		default:
			return fmt.Errorf("%s: cannot copy tar entry type %q (only files, directories and symlinks)", h.Name, h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := root.Chmod(dirs[i].name, dirs[i].mode); err != nil {
			return err
		}
	}
	return nil
}

// extractFile writes one regular file with exactly mode (no umask).
func extractFile(root *os.Root, name string, mode fs.FileMode, r io.Reader) error {
	return replaceWith(root, name, func() error {
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := f.Close(); err != nil {
			return err
		}
		return root.Chmod(name, mode)
	})
}

// replaceWith removes what is at name (not a directory) and creates it
// anew: an existing file or symlink is replaced, never written through.
func replaceWith(root *os.Root, name string, create func() error) error {
	if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
		if err := root.Remove(name); err != nil {
			return err
		}
	}
	return create()
}

package cli

import (
	"context"
	"errors"
	"fmt"
	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// newCpCmd is `cubicle cp`: copy a file or a directory tree into or out
// of a sandbox.
func newCpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files or directories between the local machine and a sandbox",
		Long: "Copy a file or a directory into or out of a sandbox. Exactly one side is NAME:/absolute/path;\n" +
			"a local side of - means stdin or stdout. A destination ending in / (remote) or an\n" +
			"existing directory (local) receives the file under its source's base name.\n\n" +
			"Directories copy recursively, like docker cp: into DST/<base of SRC> when DST is an\n" +
			"existing directory, else as DST. Permission bits are kept and symlinks stay symlinks;\n" +
			"owners are not copied, and devices, FIFOs and sockets are refused. Directory copies\n" +
			"stream a tar through `cubicle exec`, so the sandbox's image needs tar.",
		Example: "  cubicle cp ./data.csv box:/work/\n" +
			"  cubicle cp ./src box:/work/          # -> /work/src\n" +
			"  cubicle cp box:/work/out ./results   # a directory, recursively\n" +
			"  cubicle cp box:/work/out.json -\n" +
			"  tar cz src | cubicle cp - box:/tmp/src.tgz",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseCpArg(args[0]), parseCpArg(args[1])
			if err := checkCpArgs(src, dst); err != nil {
				return err
			}
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			if dst.sandbox != "" {
				return cpUpload(cmd, c, src.path, dst)
			}
			return cpDownload(cmd, c, src, dst.path)
		},
	}
}

// cpArg is one side of cp: a sandbox path when sandbox is set, else local.
type cpArg struct {
	sandbox, path string
}

// parseCpArg splits NAME:/path. A colon after a slash (./a:b) or at the
// start stays part of a local path, as in `docker cp`.
func parseCpArg(s string) cpArg {
	i := strings.IndexByte(s, ':')
	if s == "-" || i <= 0 || strings.ContainsAny(s[:i], `/\`) {
		return cpArg{path: s}
	}
	return cpArg{sandbox: s[:i], path: s[i+1:]}
}

// checkCpArgs accepts exactly one sandbox side, with an absolute path.
func checkCpArgs(src, dst cpArg) error {
	switch {
	case src.sandbox != "" && dst.sandbox != "":
		return errors.New("cp between two sandboxes is not supported: copy through a local file")
	case src.sandbox == "" && dst.sandbox == "":
		return errors.New("one of SRC and DST must be NAME:/path")
	}
	remote := dst
	if src.sandbox != "" {
		remote = src
	}
	if !path.IsAbs(remote.path) {
		return fmt.Errorf("%s:%s: the sandbox path must be absolute", remote.sandbox, remote.path)
	}
	return nil
}

func cpUpload(cmd *cobra.Command, c *cubicle.Client, local string, dst cpArg) error {
	target := dst.path
	var r io.Reader = cmd.InOrStdin()
	if local != "-" {
		f, err := os.Open(local)
		if err != nil {
			return err
		}
		defer f.Close()
		if fi, err := f.Stat(); err != nil {
			return err
		} else if fi.IsDir() {
			return cpDirUpload(cmd.Context(), c, local, dst)
		}
		r = f
	}
	if strings.HasSuffix(target, "/") {
		if local == "-" {
			return fmt.Errorf("%s:%s: name the destination file when copying from stdin", dst.sandbox, target)
		}
		target = path.Join(target, filepath.Base(local))
	}
	return c.WriteFile(cmd.Context(), dst.sandbox, target, r)
}

func cpDownload(cmd *cobra.Command, c *cubicle.Client, src cpArg, local string) error {
	rc, err := c.ReadFile(cmd.Context(), src.sandbox, src.path)
	if isDirError(err) && local != "-" {
		return cpDirDownload(cmd.Context(), c, src, local)
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	if local == "-" {
		_, err := io.Copy(cmd.OutOrStdout(), rc)
		return err
	}
	if fi, err := os.Stat(local); err == nil && fi.IsDir() {
		local = filepath.Join(local, path.Base(src.path))
	}
	return writeFileAtomic(cmd.Context(), local, rc)
}

// isDirError reports whether err is the download API refusing a
// directory (400 "... is a directory").
func isDirError(err error) bool {
	var ae *cubicle.APIError
	return errors.As(err, &ae) && ae.Status == http.StatusBadRequest && strings.HasSuffix(ae.Message, "is a directory")
}

// writeFileAtomic writes r to dst through a staging file, so a failed or
// interrupted download never leaves a truncated dst.
func writeFileAtomic(ctx context.Context, dst string, r io.Reader) error {
	return atomicfile.Write(dst, 0o644, func(w io.Writer) error {
		if _, err := io.Copy(w, r); err != nil {
			return fmt.Errorf("download to %s: %w", dst, err)
		}
		return ctx.Err()
	})
}

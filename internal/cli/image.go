package cli

import (
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/dustin/go-humanize"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"
)

func newImageCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Manage the daemon's local image store"}
	var loadName string
	load := &cobra.Command{
		Use:   "load FILE",
		Short: "Load a `docker save` tarball or OCI archive into the local image store",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			return uploadArchive(cmd, f, loadName)
		},
	}
	load.Flags().StringVar(&loadName, "name", "", "reference to give a single-image archive")

	var importName string
	var env []string
	var workdir string
	imp := &cobra.Command{
		Use:   "import ROOTFS.tar --name REF",
		Short: "Make a one-layer image from a root filesystem tarball (like `docker import`) and load it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if importName == "" {
				return fmt.Errorf("--name is required")
			}
			if len(env) == 0 {
				env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
			}
			cfg := v1.Config{Env: env, WorkingDir: workdir, Cmd: []string{"/bin/sh"}}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(image.WriteRootfsArchive(pw, importName, args[0], cfg)) }()
			return uploadArchive(cmd, pr, importName)
		},
	}
	imp.Flags().StringVar(&importName, "name", "", "reference of the new image")
	imp.Flags().StringArrayVar(&env, "env", nil, "KEY=VALUE for the image config (repeatable)")
	imp.Flags().StringVar(&workdir, "workdir", "/", "working directory of the image config")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the workspace's images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			imgs, err := c.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			usage, err := c.ImageUsage(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "REF\tDIGEST\tSIZE")
			for _, im := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", im.Ref, im.Digest, humanize.IBytes(uint64(im.Size)))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "total on disk (each layer once): %s\n", humanize.IBytes(uint64(usage)))
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm REF...",
		Short: "Remove images (a name, or a digest for every name of it) and free the layers nothing uses",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			for _, ref := range args {
				res, err := c.RemoveImage(cmd.Context(), ref)
				if err != nil {
					return fmt.Errorf("remove %s: %w", ref, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s; freed %d layer(s), %s\n", ref, res.FreedLayers, humanize.IBytes(uint64(res.FreedBytes)))
			}
			return nil
		},
	}
	cmd.AddCommand(load, imp, ls, rm)
	return cmd
}

// uploadArchive streams an image archive to the daemon and prints what it
// stored.
func uploadArchive(cmd *cobra.Command, r io.Reader, name string) error {
	c, err := clientFromEnv()
	if err != nil {
		return err
	}
	imgs, err := c.LoadImage(cmd.Context(), r, name)
	if err != nil {
		return err
	}
	for _, im := range imgs {
		fmt.Fprintf(cmd.OutOrStdout(), "loaded %s (%s)\n", im.Ref, im.Digest)
	}
	return nil
}

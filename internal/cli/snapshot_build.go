package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

type snapshotBuildFlags struct {
	file       string
	buildArgs  []string
	target     string
	tag        string
	noCache    bool
	fsCapacity string
	wait       time.Duration
}

// newSnapshotBuildCmd is `cubicle snapshot build`: a Dockerfile build on
// the daemon, its step log followed live on stderr.
func newSnapshotBuildCmd() *cobra.Command {
	var f snapshotBuildFlags
	cmd := &cobra.Command{
		Use:   "build NAME [-f Dockerfile] CONTEXT_DIR",
		Short: "Build a snapshot from a Dockerfile and print its id",
		Long: "Send CONTEXT_DIR (minus what its .dockerignore excludes, applied by the daemon) and the\n" +
			"Dockerfile to the daemon, which builds it step by step with a step cache; the log of each\n" +
			"step streams to stderr, and the snapshot id is printed on stdout once it is ready.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return snapshotBuild(ctx, cmd, args[0], args[1], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.file, "file", "f", "", "Dockerfile to build (default CONTEXT_DIR/Dockerfile)")
	fl.StringArrayVar(&f.buildArgs, "build-arg", nil, "KEY=VALUE for an ARG (repeatable)")
	fl.StringVar(&f.target, "target", "", "stage to build (default the last)")
	fl.StringVar(&f.tag, "tag", "", "tag of the snapshot under NAME (default latest)")
	fl.BoolVar(&f.noCache, "no-cache", false, "run every step, ignoring the step cache")
	fl.StringVar(&f.fsCapacity, "fs-capacity", "", "filesystem capacity of sandboxes booted from it (default the daemon's)")
	fl.DurationVar(&f.wait, "wait", time.Hour, "how long to wait for the build (it continues on the daemon after)")
	return cmd
}

func snapshotBuild(ctx context.Context, cmd *cobra.Command, name, dir string, f snapshotBuildFlags) error {
	req := protocol.BuildSnapshotRequest{Name: name, Tag: f.tag, Target: f.target, NoCache: f.noCache, BuildArgs: map[string]string{}}
	for _, kv := range f.buildArgs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--build-arg %q: want KEY=VALUE", kv)
		}
		req.BuildArgs[k] = v
	}
	if f.fsCapacity != "" {
		n, err := parseByteSize(f.fsCapacity)
		if err != nil {
			return fmt.Errorf("--fs-capacity: %w", err)
		}
		req.FSCapacityBytes = n
	}
	file := f.file
	if file == "" {
		file = filepath.Join(dir, "Dockerfile")
	}
	df, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read Dockerfile: %w", err)
	}
	req.Dockerfile = string(df)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("build context %s: not a directory", dir)
	}
	c, err := clientFromEnv(cubicle.WithPollInterval(200 * time.Millisecond))
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir)) }()
	snap, err := c.BuildSnapshot(ctx, req, pr)
	pr.Close()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.wait)
	defer cancel()
	if err := c.FollowBuildLog(ctx, snap.ID, cmd.ErrOrStderr()); err != nil {
		return err
	}
	if _, err := c.WaitSnapshot(ctx, snap.ID, nil); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w; the build of %s goes on: see `cubicle snapshot ls`", err, snap.ID)
		}
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), snap.ID)
	return nil
}

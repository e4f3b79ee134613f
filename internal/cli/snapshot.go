package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newSnapshotCmd is `cubicle snapshot`: build, list and remove snapshots,
// the bootable root filesystems sandboxes start from.
func newSnapshotCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snapshots"},
		Short:   "Build, list and remove snapshots (bootable root filesystems)",
	}
	cmd.AddCommand(newSnapshotCreateCmd(), newSnapshotBuildCmd(), newSnapshotLsCmd(), newSnapshotRmCmd(), newSnapshotCaptureCmd(),
		newSnapshotWaitCmd(), newSnapshotPackagesCmd(), newSnapshotPoolCmd())
	return cmd
}

type snapshotCreateFlags struct {
	image      string
	fsCapacity string
	registryID string
	wait       time.Duration
}

func newSnapshotCreateCmd() *cobra.Command {
	var f snapshotCreateFlags
	cmd := &cobra.Command{
		Use:   "create NAME --image REF",
		Short: "Build a snapshot from a container image and print its id",
		Long: "Build a snapshot from a container image, wait until it is ready (showing the image\n" +
			"pull on stderr) and print the snapshot id on stdout.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return snapshotCreate(ctx, cmd, args[0], f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.image, "image", "", "container image reference to build from, e.g. python:3.12-slim (required)")
	fl.StringVar(&f.fsCapacity, "fs-capacity", "10GiB", "filesystem capacity of sandboxes booted from it")
	fl.StringVar(&f.registryID, "registry-id", "", "id of the registry credentials to pull with")
	fl.DurationVar(&f.wait, "wait", 30*time.Minute, "how long to wait for the build (it continues on the daemon after)")
	_ = cmd.MarkFlagRequired("image")
	return cmd
}

func snapshotCreate(ctx context.Context, cmd *cobra.Command, name string, f snapshotCreateFlags) error {
	capacity, err := parseByteSize(f.fsCapacity)
	if err != nil {
		return fmt.Errorf("--fs-capacity: %w", err)
	}
	c, err := clientFromEnv(cubicle.WithPollInterval(500 * time.Millisecond))
	if err != nil {
		return err
	}
	snap, err := c.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{
		Name:            name,
		DockerImage:     f.image,
		FSCapacityBytes: capacity,
		RegistryID:      f.registryID,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.wait)
	defer cancel()
	prog := newPullProgress(cmd.ErrOrStderr(), f.image, "building snapshot from "+f.image+"...")
	id := snap.ID
	_, err = c.WaitSnapshot(ctx, id, prog.update)
	prog.finish()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w; the build of %s goes on: see `cubicle snapshot ls`", err, id)
		}
		return err
	}
	fmt.Fprintln(cmd.OutOrStdout(), id)
	return nil
}

// pullProgress draws the image pull of a building snapshot on a terminal: a
// byte bar once the daemon knows the total, a spinner before. On anything
// other than a terminal it prints one line and stays quiet.
type pullProgress struct {
	w       io.Writer
	image   string
	visible bool
	bar     *progressbar.ProgressBar
	total   int64
	// building: bar shows a built-in's percentage (buildStep);
	// lastTenth is the last tenth printed off a terminal (-1: none yet).
	building  bool
	lastTenth int
}

// newPullProgress shows the build of a snapshot from image; off a
// terminal it first prints line.
func newPullProgress(w io.Writer, image, line string) *pullProgress {
	_, tty := terminalFd(w)
	if !tty {
		fmt.Fprintln(w, line)
	}
	return &pullProgress{w: w, image: image, visible: tty, lastTenth: -1}
}

func (p *pullProgress) update(s protocol.Snapshot) {
	if s.Status != protocol.SnapshotBuilding {
		return
	}
	if s.BuildStep != "" {
		p.buildStep(s)
		return
	}
	if !p.visible {
		return
	}
	if p.bar == nil {
		p.bar = progressbar.NewOptions64(-1, // unknown length: a spinner
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetDescription("pulling "+p.image),
			progressbar.OptionShowBytes(true),
			progressbar.OptionShowTotalBytes(true),
			progressbar.OptionUseIECUnits(true),
			progressbar.OptionSpinnerType(14),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	if s.PullBytesTotal > 0 && s.PullBytesTotal != p.total {
		p.total = s.PullBytesTotal
		p.bar.ChangeMax64(p.total) // spinner → bar
	}
	if s.PullBytesTotal == 0 && s.PullBytesDone == 0 && p.total > 0 {
		p.bar.Describe("unpacking " + p.image) // pull over, build goes on
	}
	_ = p.bar.Set64(s.PullBytesDone)
}

// buildStep shows a built-in snapshot's build: a percentage bar described
// by the step on a terminal, else a line at each tenth of the way.
func (p *pullProgress) buildStep(s protocol.Snapshot) {
	if !p.visible {
		if s.BuildPercent/10 != p.lastTenth {
			p.lastTenth = s.BuildPercent / 10
			fmt.Fprintf(p.w, "%3d%% %s\n", s.BuildPercent, s.BuildStep)
		}
		return
	}
	if p.bar == nil || !p.building {
		p.finish()
		p.building = true
		p.bar = progressbar.NewOptions(100,
			progressbar.OptionSetWriter(p.w),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)
	}
	step := s.BuildStep
	if len(step) > 60 {
		step = step[:57] + "..."
	}
	p.bar.Describe(step)
	_ = p.bar.Set(s.BuildPercent)
}

func (p *pullProgress) finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}

type snapshotLsFlags struct {
	name string
}

func newSnapshotLsCmd() *cobra.Command {
	var f snapshotLsFlags
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List snapshots",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			l, err := c.ListSnapshots(cmd.Context(), cubicle.ListOptions{NameContains: f.name, Limit: 500})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSTATUS\tIMAGE\tCREATED")
			for _, s := range l.Snapshots {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.ID, s.Name, snapshotStatus(s), orDash(s.DockerImage), ago(s.CreatedAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if l.NextCursor != nil && *l.NextCursor != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "(more snapshots not shown; narrow with --name)")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&f.name, "name", "", "show only snapshots whose name contains this")
	return cmd
}

func newSnapshotRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   "Delete snapshots",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			return forEachArg(cmd, args, func(id string) error { return c.DeleteSnapshot(cmd.Context(), id) })
		},
	}
}

// forEachArg applies op to every argument, printing each one that succeeded,
// and reports every failure rather than stopping at the first.
func forEachArg(cmd *cobra.Command, args []string, op func(string) error) error {
	var errs []error
	for _, a := range args {
		if err := op(a); err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintln(cmd.OutOrStdout(), a)
	}
	return errors.Join(errs...)
}

// snapshotStatus is a snapshot's status for a listing: a building
// built-in's percentage, and "built-in" for the server's own.
func snapshotStatus(s protocol.Snapshot) string {
	st := s.Status
	if s.Status == protocol.SnapshotBuilding && s.BuildStep != "" {
		st = fmt.Sprintf("%s %d%%", st, s.BuildPercent)
	}
	if s.Builtin {
		st += " (built-in)"
	}
	return st
}

func newSnapshotWaitCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "wait NAME|ID",
		Short: "Wait until a snapshot is ready (showing its build), then print its id",
		Long: "Wait until a snapshot is ready, showing its image pull or, for the server's built-in\n" +
			"default computer, its build, on stderr; print the snapshot id on stdout. Fails if the build does.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			ctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			c, err := clientFromEnv(cubicle.WithPollInterval(500 * time.Millisecond))
			if err != nil {
				return err
			}
			prog := newPullProgress(cmd.ErrOrStderr(), args[0], "waiting for snapshot "+args[0]+"...")
			s, err := c.WaitSnapshot(ctx, args[0], prog.update)
			prog.finish()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "timeout", 30*time.Minute, "how long to wait")
	return cmd
}

func newSnapshotPackagesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "packages NAME|ID",
		Short: "List the packages (and versions) a built-in snapshot was built with",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			s, err := c.GetSnapshot(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if len(s.Packages) == 0 {
				return fmt.Errorf("snapshot %s records no packages (only built-in snapshots built from a blueprint do)", args[0])
			}
			names := slices.Sorted(maps.Keys(s.Packages))
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PACKAGE\tVERSION")
			for _, n := range names {
				fmt.Fprintf(tw, "%s\t%s\n", n, s.Packages[n])
			}
			return tw.Flush()
		},
	}
}

package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
)

// newSnapshotCaptureCmd is `cubicle snapshot capture SANDBOX NAME`.
func newSnapshotCaptureCmd() *cobra.Command {
	var workDir, user string
	var memory bool
	cmd := &cobra.Command{
		Use:   "capture SANDBOX NAME",
		Short: "Snapshot a sandbox's filesystem as it is now (it keeps running)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			req := protocol.CaptureSnapshotRequest{Name: args[1], IncludeMemory: memory}
			if workDir != "" || user != "" {
				req.RunConfig = &protocol.RunConfig{WorkDir: workDir, User: user}
			}
			s, err := c.CaptureSnapshot(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if s.Status != protocol.SnapshotReady {
				if s, err = c.WaitSnapshot(cmd.Context(), s.ID, nil); err != nil {
					return err
				}
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			return nil
		},
	}
	cmd.Flags().StringVar(&workDir, "workdir", "", "working directory commands in sandboxes from the snapshot start in")
	cmd.Flags().StringVar(&user, "user", "", "user commands in sandboxes from the snapshot run as")
	cmd.Flags().BoolVar(&memory, "memory", false, "also save its memory: sandboxes from the snapshot resume its processes (gvisor)")
	return cmd
}

// newSandboxForkCmd is `cubicle sandbox fork NAME --count N`.
func newSandboxForkCmd() *cobra.Command {
	var req protocol.ForkRequest
	var timeout int64
	cmd := &cobra.Command{
		Use:   "fork NAME",
		Short: "Capture a running sandbox and boot copy-on-write branches of it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			if timeout > 0 {
				req.Timeout = &timeout
			}
			res, err := c.Fork(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "snapshot\t%s\n", res.SnapshotID)
			for _, sb := range res.Sandboxes {
				fmt.Fprintf(w, "%s\t%s\n", sb.Name, sb.Status)
			}
			return w.Flush()
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&req.Count, "count", 1, "number of branches")
	fl.StringSliceVar(&req.Names, "names", nil, "branch names (comma-separated, --count of them)")
	fl.StringVar(&req.SnapshotName, "snapshot-name", "", "name of the captured snapshot")
	fl.Int64Var(&timeout, "timeout", 0, "seconds to wait for every branch to be ready (default 60)")
	fl.BoolVar(&req.IncludeMemory, "memory", false, "capture memory too: branches resume the sandbox's running processes (gvisor)")
	return cmd
}

// newSandboxResetCmd is `cubicle sandbox reset NAME [--to SNAPSHOT]`.
func newSandboxResetCmd() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "reset NAME",
		Short: "Discard a sandbox's changes and restart it from a snapshot",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			sb, err := c.ResetSandbox(cmd.Context(), args[0], to)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\t%s\t%s\n", sb.Name, sb.Status, sb.SnapshotID)
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "snapshot id or name to reset to (default: the sandbox's own)")
	return cmd
}

// newDiffCmd is `cubicle diff A B`.
func newDiffCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "diff A B",
		Short: "List paths added (A), modified (M) or deleted (D) going from A to B (sandbox names or snapshot ids/names)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			d, err := c.Diff(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, ch := range d.Changes {
				fmt.Fprintf(w, "%s\t%d\t%s\n", strings.ToUpper(ch.Kind[:1]), ch.SizeBytes, ch.Path)
			}
			return w.Flush()
		},
	}
}

// newDoctorCmd is `cubicle doctor`: host state of sandboxes the daemon has
// no record of, and (--clean) its cleanup. The daemon also cleans it at
// every start.
func newDoctorCmd() *cobra.Command {
	var clean bool
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "List (or --clean) runtime instances, networks and storage of sandboxes the daemon does not know (instance admin)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			list := c.Leftovers
			if clean {
				list = c.CleanLeftovers
			}
			left, err := list(cmd.Context())
			if err != nil {
				return err
			}
			if len(left) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no leftovers")
				return nil
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tID\tMOVED TO")
			for _, l := range left {
				fmt.Fprintf(w, "%s\t%s\t%s\n", l.Kind, l.ID, l.Moved)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&clean, "clean", false, "stop, tear down and unmount them; their files are moved to <data-dir>/cow/orphans, never deleted")
	return cmd
}

// newInfoCmd is `cubicle info`: the daemon's default runtime (and every
// runtime it serves, when several), storage backend,
// health and store space. It exits non-zero when the daemon is
// unavailable, so scripts can wait on it.
func newInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show the daemon's runtimes, storage, health and free space",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			in, err := c.Info(cmd.Context())
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			rt := in.Runtime
			if in.Accelerator != "" {
				rt += " (" + in.Accelerator + ")"
			}
			fmt.Fprintf(w, "runtime\t%s\n", rt)
			if len(in.Runtimes) > 1 {
				served := make([]string, len(in.Runtimes))
				for i, r := range in.Runtimes {
					served[i] = r.Name
					if r.Accelerator != "" {
						served[i] += " (" + r.Accelerator + ")"
					}
				}
				fmt.Fprintf(w, "runtimes\t%s\n", strings.Join(served, ", "))
			}
			fmt.Fprintf(w, "storage\t%s\nstatus\t%s\n", in.Storage, in.Status)
			for _, r := range in.Reasons {
				fmt.Fprintf(w, "  problem\t%s\n", r)
			}
			if sp := in.Space; sp != nil {
				space := func(name string, fs protocol.FSSpace) {
					ro := ""
					if fs.ReadOnly {
						ro = " (read-only)"
					}
					fmt.Fprintf(w, "%s\t%s used, %s free of %s%s\t%s\n", name, humanize.IBytes(uint64(fs.Used)),
						humanize.IBytes(uint64(fs.Free)), humanize.IBytes(uint64(fs.Total)), ro, fs.Path)
				}
				space("store space", sp.Store)
				if sp.Host != nil {
					space("host space", *sp.Host)
				}
				fmt.Fprintf(w, "usable\t%s\n", humanize.IBytes(uint64(max(sp.Usable, 0))))
				if m := sp.Metadata; m != nil {
					fmt.Fprintf(w, "metadata\t%s used of %s, %s free (reserve %s, %s unallocated)\n", humanize.IBytes(uint64(m.Used)),
						humanize.IBytes(uint64(m.Total)), humanize.IBytes(uint64(m.Free)), humanize.IBytes(uint64(m.Reserve)), humanize.IBytes(uint64(m.Unallocated)))
				}
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if in.Status == "unavailable" {
				return fmt.Errorf("daemon unavailable: %s", strings.Join(in.Reasons, "; "))
			}
			return nil
		},
	}
}

package cli

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newSandboxCmd is `cubicle sandbox`: create, list, stop, start and remove
// sandboxes.
func newSandboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "sandbox",
		Aliases: []string{"sandboxes", "box"},
		Short:   "Create, list, stop, start and remove sandboxes",
	}
	cmd.AddCommand(newSandboxCreateCmd(), newSandboxLsCmd(), newSandboxRmCmd(),
		newSandboxStopCmd(), newSandboxStartCmd(), newSandboxForkCmd(), newSandboxResetCmd(), newSandboxStatsCmd())
	return cmd
}

type sandboxCreateFlags struct {
	snapshot   string
	name       string
	vcpus      int64
	memory     string
	fsCapacity string
	timeout    int64
	// preserveMemory is --preserve-memory-on-stop; nil when not given.
	preserveMemory *bool
	volumes        []string // --volume NAME:/path[:ro]
	// docker is --docker; nil when not given (the snapshot decides).
	docker  *bool
	runtime string
}

func newSandboxCreateCmd() *cobra.Command {
	var f sandboxCreateFlags
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox, wait until it is ready and print its name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := f.request()
			if err != nil {
				return err
			}
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			// The daemon blocks up to --timeout; allow it that plus slack.
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Duration(f.timeout+30)*time.Second)
			defer cancel()
			sb, err := c.CreateSandbox(ctx, req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.Name)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.snapshot, "snapshot", "", "snapshot id or name[:tag] to boot (default: the daemon's default)")
	fl.StringVar(&f.name, "name", "", "sandbox name (default: generated)")
	fl.Int64Var(&f.vcpus, "vcpus", 0, "virtual CPUs (default: the daemon's)")
	fl.StringVar(&f.memory, "memory", "", "memory limit, e.g. 512MiB (default: the daemon's)")
	fl.StringVar(&f.fsCapacity, "fs-capacity", "", "filesystem capacity, e.g. 10GiB (default: the snapshot's)")
	fl.Int64Var(&f.timeout, "timeout", 60, "seconds the daemon may take to make the sandbox ready")
	fl.StringVar(&f.runtime, "runtime", "", "runtime to run on, one the daemon serves (cubicle info lists them; default: the daemon's default)")
	fl.StringArrayVar(&f.volumes, "volume", nil, "attach a persistent volume, NAME:/path[:ro] (repeatable)")
	optionalBool(fl, &f.preserveMemory, "preserve-memory-on-stop", "checkpoint the sandbox's memory at every stop, so a start resumes its processes (gvisor)")
	optionalBool(fl, &f.docker, "docker", "run the sandbox with what Docker inside needs (gvisor; default: the snapshot's; the built-in snapshot docker has it and starts dockerd)")
	return cmd
}

// optionalBool defines bool flag name whose *p stays nil unless given, for
// request fields whose absence differs from false.
func optionalBool(fl *pflag.FlagSet, p **bool, name, usage string) {
	fl.Var(&optBool{p: p}, name, usage)
	fl.Lookup(name).NoOptDefVal = "true"
}

// optBool is the pflag.Value of optionalBool.
type optBool struct{ p **bool }

func (o *optBool) String() string {
	if o.p == nil || *o.p == nil {
		return ""
	}
	return strconv.FormatBool(**o.p)
}

func (o *optBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*o.p = &v
	return nil
}

func (o *optBool) Type() string { return "bool" }

// request turns the flags into the create body. A --snapshot that parses as
// a UUID is an id, anything else a name.
func (f sandboxCreateFlags) request() (protocol.CreateSandboxRequest, error) {
	wait := true
	timeout := f.timeout
	req := protocol.CreateSandboxRequest{WaitForReady: &wait, Timeout: &timeout, Name: f.name, PreserveMemoryOnStop: f.preserveMemory,
		Docker: f.docker, Runtime: f.runtime}
	if f.snapshot != "" {
		if _, err := uuid.Parse(f.snapshot); err == nil {
			req.SnapshotID = f.snapshot
		} else {
			req.SnapshotName = f.snapshot
		}
	}
	if f.vcpus > 0 {
		v := f.vcpus
		req.VCPUs = &v
	}
	if f.memory != "" {
		n, err := parseByteSize(f.memory)
		if err != nil {
			return req, fmt.Errorf("--memory: %w", err)
		}
		req.MemBytes = &n
	}
	if f.fsCapacity != "" {
		n, err := parseByteSize(f.fsCapacity)
		if err != nil {
			return req, fmt.Errorf("--fs-capacity: %w", err)
		}
		req.FSCapacityBytes = &n
	}
	for _, s := range f.volumes {
		a, err := parseVolumeFlag(s)
		if err != nil {
			return req, err
		}
		req.Volumes = append(req.Volumes, a)
	}
	return req, nil
}

func newSandboxLsCmd() *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			l, err := c.ListSandboxes(cmd.Context(), cubicle.ListOptions{NameContains: name, Limit: 500})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATUS\tSNAPSHOT\tVCPUS\tMEMORY\tCREATED")
			for _, s := range l.Sandboxes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.Name, s.Status, orDash(s.SnapshotID),
					s.VCPUs, humanize.IBytes(uint64(max(s.MemBytes, 0))), ago(s.CreatedAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if l.NextCursor != nil && *l.NextCursor != "" {
				fmt.Fprintln(cmd.ErrOrStderr(), "(more sandboxes not shown; narrow with --name)")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "show only sandboxes whose name contains this")
	return cmd
}

func newSandboxRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "Delete sandboxes and their filesystems",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			return forEachArg(cmd, args, func(n string) error { return c.DeleteSandbox(cmd.Context(), n) })
		},
	}
}

func newSandboxStopCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "stop NAME...",
		Short: "Stop sandboxes, keeping their filesystems",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			return forEachArg(cmd, args, func(n string) error { return c.StopSandbox(cmd.Context(), n) })
		},
	}
}

func newSandboxStartCmd() *cobra.Command {
	var wait time.Duration
	var req protocol.StartSandboxRequest
	cmd := &cobra.Command{
		Use:   "start NAME...",
		Short: "Start stopped sandboxes and wait until they are ready",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv(cubicle.WithPollInterval(500 * time.Millisecond))
			if err != nil {
				return err
			}
			return forEachArg(cmd, args, func(n string) error {
				if err := c.StartSandboxWith(cmd.Context(), n, req); err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), wait)
				defer cancel()
				_, err := c.WaitSandbox(ctx, n)
				return err
			})
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 2*time.Minute, "how long to wait for each sandbox to be ready")
	optionalBool(cmd.Flags(), &req.RestoreMemory, "restore-memory",
		"resume from the memory a memory-preserving stop kept: true requires it, false boots cold and discards it (default: if there is one)")
	return cmd
}

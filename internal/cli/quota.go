package cli

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// quotaFields are the quotas the CLI shows and sets, in order: the flag
// (--max-<name>), whether it is a size, and where it lives in a Quota and
// a Usage.
var quotaFields = []struct {
	flag  string
	bytes bool
	limit func(*protocol.Quota) **int64
	used  func(*protocol.Usage) int64
}{
	{"sandboxes", false, func(q *protocol.Quota) **int64 { return &q.MaxSandboxes }, func(u *protocol.Usage) int64 { return u.Sandboxes }},
	{"vcpus", false, func(q *protocol.Quota) **int64 { return &q.MaxVCPUs }, func(u *protocol.Usage) int64 { return u.VCPUs }},
	{"mem", true, func(q *protocol.Quota) **int64 { return &q.MaxMemBytes }, func(u *protocol.Usage) int64 { return u.MemBytes }},
	{"storage", true, func(q *protocol.Quota) **int64 { return &q.MaxStorageBytes }, func(u *protocol.Usage) int64 { return u.StorageBytes }},
	{"snapshots", false, func(q *protocol.Quota) **int64 { return &q.MaxSnapshots }, func(u *protocol.Usage) int64 { return u.Snapshots }},
}

// newQuotaCmd is `cubicle quota`: a workspace's ceilings.
func newQuotaCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Show or set a workspace's quotas (sandboxes, running vCPUs and memory, storage, snapshots)",
	}
	cmd.AddCommand(newQuotaGetCmd(), newQuotaSetCmd())
	return cmd
}

// workspaceArg is the WORKSPACE argument, the default workspace if absent.
func workspaceArg(args []string) string {
	if len(args) > 0 {
		return args[0]
	}
	return auth.DefaultWorkspace
}

func newQuotaGetCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "get [WORKSPACE]",
		Short: "Show a workspace's quotas (default: the default workspace)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			q, err := c.GetQuota(cmd.Context(), workspaceArg(args))
			if err != nil {
				return err
			}
			return printQuota(cmd.OutOrStdout(), &q.Quota, nil)
		},
	}
}

func newQuotaSetCmd() *cobra.Command {
	vals := make([]string, len(quotaFields))
	cmd := &cobra.Command{
		Use:   "set WORKSPACE [--max-sandboxes N] [--max-vcpus N] [--max-mem SIZE] [--max-storage SIZE] [--max-snapshots N]",
		Short: "Change a workspace's quotas (instance admin only); quotas not named keep their value",
		Long: "Change the quotas named by flags, keeping the others. A value of \"unlimited\" removes a\n" +
			"quota; sizes take units, e.g. 64GiB. Storage counts the sandboxes' declared fs_capacity_bytes.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			cur, err := c.GetQuota(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			q := cur.Quota
			for i, f := range quotaFields {
				if !cmd.Flags().Changed("max-" + f.flag) {
					continue
				}
				v, err := parseQuota(vals[i], f.bytes)
				if err != nil {
					return fmt.Errorf("--max-%s: %w", f.flag, err)
				}
				*f.limit(&q) = v
			}
			got, err := c.SetQuota(cmd.Context(), args[0], q)
			if err != nil {
				return err
			}
			return printQuota(cmd.OutOrStdout(), &got.Quota, nil)
		},
	}
	for i, f := range quotaFields {
		what := "count"
		if f.bytes {
			what = "size, e.g. 64GiB"
		}
		cmd.Flags().StringVar(&vals[i], "max-"+f.flag, "", fmt.Sprintf("maximum %s (%s, or unlimited)", f.flag, what))
	}
	return cmd
}

func newUsageCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "usage [WORKSPACE]",
		Short: "Show what a workspace uses against its quotas (default: the default workspace)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			ws := workspaceArg(args)
			u, err := c.Usage(cmd.Context(), ws)
			if err != nil {
				return err
			}
			q, err := c.GetQuota(cmd.Context(), ws)
			if err != nil {
				return err
			}
			if err := printQuota(cmd.OutOrStdout(), &q.Quota, u); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "(%s measured on disk)\n", humanize.IBytes(uint64(max(u.FSUsedBytes, 0))))
			return err
		},
	}
}

// parseQuota reads a quota flag: "unlimited", a count, or (bytes) a size.
func parseQuota(s string, bytes bool) (*int64, error) {
	if s == "unlimited" {
		return nil, nil
	}
	if !bytes {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("want a count of 0 or more, or unlimited; got %q", s)
		}
		return &n, nil
	}
	n, err := humanize.ParseBytes(s)
	if err != nil || n > math.MaxInt64 {
		return nil, fmt.Errorf("want a size such as 64GiB, or unlimited; got %q", s)
	}
	v := int64(n)
	return &v, nil
}

// printQuota writes one line per quota, with its usage when u is given.
func printQuota(w io.Writer, q *protocol.Quota, u *protocol.Usage) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if u != nil {
		fmt.Fprintln(tw, "QUOTA\tUSED\tLIMIT")
	} else {
		fmt.Fprintln(tw, "QUOTA\tLIMIT")
	}
	for _, f := range quotaFields {
		limit := "unlimited"
		if v := *f.limit(q); v != nil {
			limit = quotaValue(*v, f.bytes)
		}
		if u != nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", f.flag, quotaValue(f.used(u), f.bytes), limit)
		} else {
			fmt.Fprintf(tw, "%s\t%s\n", f.flag, limit)
		}
	}
	return tw.Flush()
}

func quotaValue(v int64, bytes bool) string {
	if bytes {
		return humanize.IBytes(uint64(max(v, 0)))
	}
	return strconv.FormatInt(v, 10)
}

package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// statsInterval is the gap between the two samples a CPU % is computed
// from, and the refresh period of --watch.
const statsInterval = time.Second

// newSandboxStatsCmd is `cubicle sandbox stats [NAME]`, like docker stats:
// a table of CPU %, memory, disk and network per sandbox, once or, with
// --watch, refreshed every second.
func newSandboxStatsCmd() *cobra.Command {
	var watch bool
	cmd := &cobra.Command{
		Use:   "stats [NAME]",
		Short: "Show live CPU, memory, disk and network use of sandboxes",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			sample := func(ctx context.Context) ([]protocol.SandboxStats, error) {
				if len(args) == 1 {
					st, err := c.SandboxStats(ctx, args[0])
					if err != nil {
						return nil, err
					}
					return []protocol.SandboxStats{*st}, nil
				}
				return c.ListSandboxStats(ctx)
			}
			return runStats(cmd.Context(), cmd.OutOrStdout(), sample, watch)
		},
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "refresh every second until interrupted")
	return cmd
}

// runStats prints the table from two samples statsInterval apart, then
// (watch) again at every interval.
func runStats(ctx context.Context, w io.Writer, sample func(context.Context) ([]protocol.SandboxStats, error), watch bool) error {
	prev, err := sample(ctx)
	if err != nil {
		return err
	}
	t := time.NewTicker(statsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		cur, err := sample(ctx)
		if err != nil {
			return err
		}
		if watch {
			fmt.Fprint(w, "\033[H\033[2J") // clear the terminal, as docker stats does
		}
		if err := writeStats(w, prev, cur); err != nil || !watch {
			return err
		}
		prev = cur
	}
}

// writeStats writes one table row per sandbox of cur; CPU % is from its
// CPU time since prev (100 % is one core).
func writeStats(w io.Writer, prev, cur []protocol.SandboxStats) error {
	before := map[string]protocol.SandboxStats{}
	for _, s := range prev {
		before[s.ID] = s
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tCPU %\tMEM USAGE / LIMIT\tDISK\tNET I/O")
	for _, s := range cur {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s / %s\t%s\t%s / %s\n", s.Name, s.Status, cpuPercent(before[s.ID], s),
			humanize.IBytes(uint64(max(s.MemoryBytes, 0))), humanize.IBytes(uint64(max(s.MemoryLimitBytes, 0))),
			diskCell(s.DiskBytes), humanize.Bytes(uint64(max(s.NetRxBytes, 0))), humanize.Bytes(uint64(max(s.NetTxBytes, 0))))
	}
	return tw.Flush()
}

// cpuPercent is the CPU use between samples a and b of one sandbox, "--"
// without two samples of a running instance.
func cpuPercent(a, b protocol.SandboxStats) string {
	dt := b.SampledAt.Sub(a.SampledAt).Seconds()
	if a.ID == "" || dt <= 0 || b.CPUSeconds < a.CPUSeconds {
		return "--"
	}
	return fmt.Sprintf("%.2f%%", 100*(b.CPUSeconds-a.CPUSeconds)/dt)
}

func diskCell(n int64) string {
	if n < 0 {
		return "--"
	}
	return humanize.IBytes(uint64(n))
}

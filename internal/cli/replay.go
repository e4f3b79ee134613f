package cli

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newAuditDiffCmd is `cubicle audit diff A B`: where two sandboxes'
// histories diverge (a fork's branches share their parent's commands).
func newAuditDiffCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "diff A B",
		Short: "Compare two sandboxes' command histories: the steps they share, then each one's own",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			d, err := c.AuditDiff(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				return json.NewEncoder(out).Encode(d)
			}
			fmt.Fprintf(out, "common (%d):\n", len(d.Common))
			printHistory(out, "  ", d.Common)
			fmt.Fprintf(out, "only %s (%d):\n", d.A, len(d.OnlyA))
			printHistory(out, "- ", d.OnlyA)
			fmt.Fprintf(out, "only %s (%d):\n", d.B, len(d.OnlyB))
			printHistory(out, "+ ", d.OnlyB)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the comparison as JSON")
	return cmd
}

// printHistory writes one line per step: outcome, command, files changed.
func printHistory(w io.Writer, mark string, steps []protocol.HistoryStep) {
	for _, s := range steps {
		fmt.Fprintf(w, "%s%-10s %s", mark, outcome(s.ExitCode, s.Error), s.Command)
		if n := len(s.Files); n > 0 {
			fmt.Fprintf(w, "  (%d file event(s))", n)
		}
		fmt.Fprintln(w)
	}
}

func outcome(code *int, errType string) string {
	switch {
	case code != nil:
		return fmt.Sprintf("exit %d", *code)
	case errType != "":
		return errType
	}
	return "running"
}

// newReplayCmd is `cubicle replay NAME`: re-run a sandbox's recorded
// commands in a new sandbox and say which ones behaved the same.
func newReplayCmd() *cobra.Command {
	var (
		req    protocol.ReplayRequest
		steps  []int64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "replay NAME",
		Short: "Re-run a sandbox's recorded commands in a new sandbox and compare exit codes and output",
		Long: "Creates a sandbox from the snapshot the history starts from (--from to choose another) and re-runs the\n" +
			"recorded commands in order: all of them, a fork branch's parent's included, or --steps of NAME's own record.\n" +
			"Env values and stdin a command got from its caller are not replayed (the record keeps env names only).\n" +
			"Exits 1 when any step's exit code or output differs.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			req.Steps = protocol.ReplaySteps{IDs: steps, All: len(steps) == 0}
			res, err := c.Replay(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				if err := json.NewEncoder(out).Encode(res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(out, "replayed into %s\n", res.Sandbox.Name)
				for _, s := range res.Steps {
					verdict := "same"
					if !s.ExitMatched || !s.OutputMatched {
						verdict = "DIFFERS"
					}
					fmt.Fprintf(out, "%-8s %-10s (was %-10s) %s\n", verdict, outcome(s.ExitCode, s.Error), outcome(s.Source.ExitCode, s.Source.Error), s.Source.Command)
				}
			}
			if !res.Matched {
				return exitCode(1)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&req.FromSnapshot, "from", "", "snapshot (id or name) to start from (default: where the history starts)")
	fl.Int64SliceVar(&steps, "steps", nil, "step numbers of NAME's own record to replay (default: the whole history)")
	fl.StringVar(&req.Name, "name", "", "name of the new sandbox")
	fl.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

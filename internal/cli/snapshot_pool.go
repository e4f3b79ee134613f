package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newSnapshotPoolCmd is `cubicle snapshot pool NAME [--size N] [--max-age D]`:
// with --size it sets the snapshot's warm pool (0 removes it), without it
// shows the pool.
func newSnapshotPoolCmd() *cobra.Command {
	var size int64
	var maxAge time.Duration
	cmd := &cobra.Command{
		Use:   "pool NAME",
		Short: "Show or set a snapshot's warm pool of pre-booted instances",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			var p *protocol.SnapshotPool
			if cmd.Flags().Changed("size") {
				p, err = c.SetSnapshotPool(cmd.Context(), args[0], size, int64(maxAge/time.Second))
			} else {
				p, err = c.SnapshotPool(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			age := "none"
			if p.MaxAgeSeconds > 0 {
				age = (time.Duration(p.MaxAgeSeconds) * time.Second).String()
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\tsize %d\tready %d\tmax age %s\n", args[0], p.Size, p.Ready, age)
			return nil
		},
	}
	cmd.Flags().Int64Var(&size, "size", 0, "instances to keep booted (0 removes the pool)")
	cmd.Flags().DurationVar(&maxAge, "max-age", 0, "recycle instances older than this (0: never)")
	return cmd
}

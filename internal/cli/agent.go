package cli

import (
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/agent"
)

// newAgentCmd is `cubicle agent`, PID 1 inside every sandbox. The token
// comes only from standard input (see agent.ReadToken), never the
// environment or argv, which root inside can read in /proc/1.
func newAgentCmd() *cobra.Command {
	var listen string
	var verbose bool
	cmd := &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (PID 1 inside a sandbox)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := agent.ReadToken(os.Stdin)
			if err != nil {
				return err
			}
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			return agent.Run(cmd.Context(), listen, token, log)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", net.JoinHostPort("0.0.0.0", strconv.Itoa(agent.Port)), "address to serve the agent API on")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log every command")
	return cmd
}

package cli

import (
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/agent"
)

// newAgentCmd is `cubicle agent`, PID 1 inside a sandbox when
// cubicle-agent does not ship beside the daemon (see agentBinary).
func newAgentCmd() *cobra.Command {
	var listen string
	var verbose bool
	cmd := &cobra.Command{
		Use:    "agent",
		Short:  "Run the in-sandbox agent (PID 1 inside a sandbox)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return agent.Main(cmd.Context(), listen, verbose)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", agent.DefaultListen, "address to serve the agent API on")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log every command")
	return cmd
}

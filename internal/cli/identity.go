package cli

import (
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// newSetIdentityCmd is `cubicle set-identity HOSTNAME MACHINE_ID`, which
// a driver runs inside a claimed warm-pool instance (runtime.Identifier)
// with the capability the agent lacks.
func newSetIdentityCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "set-identity HOSTNAME MACHINE_ID",
		Short:  "Give this sandbox its hostname and machine-id (run by the runtime inside a sandbox)",
		Hidden: true,
		Args:   cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runtime.ApplyIdentity(cmd.Context(), args[0], args[1])
		},
	}
}

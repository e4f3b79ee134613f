package cli

import (
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/runtime/namespace"
)

// newNSInitCmd is the namespace driver's re-exec entry point: the driver
// starts `/proc/self/exe nsinit` inside fresh namespaces, and this command
// builds the sandbox's root and execs the agent. Hidden: never run by hand.
func newNSInitCmd() *cobra.Command {
	return &cobra.Command{
		Use:                namespace.InitArg,
		Hidden:             true,
		DisableFlagParsing: true,
		Run:                func(*cobra.Command, []string) { namespace.Init() },
	}
}

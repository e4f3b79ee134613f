package cli

import (
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/internal/runtime/microvm"
)

// newVMJailCmd is the microvm driver's re-exec entry point: the driver
// starts `/proc/self/exe vmjail` in QEMU's fresh namespaces, and this
// command builds QEMU's root and execs it. Hidden: never run by hand.
func newVMJailCmd() *cobra.Command {
	return &cobra.Command{
		Use:                microvm.JailArg,
		Hidden:             true,
		DisableFlagParsing: true,
		Run:                func(*cobra.Command, []string) { microvm.Jail() },
	}
}

// Package cli wires Cubicle's subcommands. Each role lives in its own file:
// serve.go (daemon), agent.go (PID 1 inside a sandbox), and the client
// commands, which talk to the daemon only through sdk/go.
package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// Main runs the command line and returns the process exit code.
func Main(args []string) int {
	root := &cobra.Command{
		Use:           "cubicle",
		Short:         "Cubicle: every AI agent gets its own computer",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// One constructor per top-level subcommand; each lives in its own file.
	root.AddCommand(
		newServeCmd(),
		newAgentCmd(),
		newSetIdentityCmd(),
		newImageCmd(),
		newSnapshotCmd(),
		newSandboxCmd(),
		newExecCmd(),
		newCpCmd(),
		newNSInitCmd(),
		newVMJailCmd(),
		newDiffCmd(),
		newShareCmd(),
		newInfoCmd(),
		newDoctorCmd(),
		newPortForwardCmd(),
		newWorkspaceCmd(),
		newUserCmd(),
		newKeyCmd(),
		newWhoAmICmd(),
		newAccessLogCmd(),
		newQuotaCmd(),
		newVolumeCmd(),
		newUsageCmd(),
		newAuditCmd(),
		newReplayCmd(),
		newMCPCmd(),
	)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		var ec exitCode
		if asExit(err, &ec) {
			return int(ec)
		}
		fmt.Fprintln(os.Stderr, "cubicle:", err)
		return 1
	}
	return 0
}

// exitCode is returned by commands that must exit with a specific status
// (e.g. `cubicle exec` mirrors the remote command's exit code).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func asExit(err error, out *exitCode) bool {
	if ec, ok := err.(exitCode); ok {
		*out = ec
		return true
	}
	return false
}

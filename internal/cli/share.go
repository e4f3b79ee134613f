package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// shareWorkspace is the --with value that shares with the whole workspace.
const shareWorkspace = "workspace"

// newShareCmd is `cubicle share`: grant (the command itself), list and
// revoke access to a sandbox or, with --snapshot, a snapshot.
func newShareCmd() *cobra.Command {
	var snapshot bool
	var with, access string
	cmd := &cobra.Command{
		Use:   "share NAME --with USER|workspace --access read|use",
		Short: "Share a sandbox (or, with --snapshot, a snapshot) with a user or the whole workspace",
		Long: "Share a sandbox or snapshot and print the share. read lets the grantee see it, download\n" +
			"its files and open its services; use also lets it run commands, upload, stop, start, fork\n" +
			"and capture. Sharing again with the same grantee changes its access.\n" +
			"Subcommands: share ls NAME, share rm NAME SHARE_ID.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			req := protocol.ShareRequest{UserID: with, Access: access}
			if with == shareWorkspace {
				req = protocol.ShareRequest{Workspace: true, Access: access}
			}
			sh, err := c.Share(cmd.Context(), shareKind(snapshot), args[0], req)
			if err != nil {
				return err
			}
			return printShares(cmd, []protocol.Share{*sh})
		},
	}
	fl := cmd.PersistentFlags()
	fl.BoolVar(&snapshot, "snapshot", false, "NAME is a snapshot id, not a sandbox")
	cmd.Flags().StringVar(&with, "with", "", `user id to share with, or "workspace" for every user of the workspace (required)`)
	cmd.Flags().StringVar(&access, "access", protocol.ShareRead, "read or use")
	_ = cmd.MarkFlagRequired("with")
	cmd.AddCommand(&cobra.Command{
		Use:     "ls NAME",
		Aliases: []string{"list"},
		Short:   "List the shares of a sandbox or snapshot",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			list, err := c.ListShares(cmd.Context(), shareKind(snapshot), args[0])
			if err != nil {
				return err
			}
			return printShares(cmd, list)
		},
	}, &cobra.Command{
		Use:     "rm NAME SHARE_ID",
		Aliases: []string{"revoke"},
		Short:   "Revoke a share (open exec streams of those who lose access end at once)",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			return c.Unshare(cmd.Context(), shareKind(snapshot), args[0], args[1])
		},
	})
	return cmd
}

func shareKind(snapshot bool) cubicle.ShareKind {
	if snapshot {
		return cubicle.ShareSnapshot
	}
	return cubicle.ShareSandbox
}

func printShares(cmd *cobra.Command, list []protocol.Share) error {
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tWITH\tACCESS\tBY\tCREATED")
	for _, sh := range list {
		with := sh.Grantee
		if with == protocol.ShareGranteeWorkspace {
			with = shareWorkspace
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", sh.ID, with, sh.Access, sh.CreatedBy, ago(sh.CreatedAt))
	}
	return tw.Flush()
}

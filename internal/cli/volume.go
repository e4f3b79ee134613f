package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newVolumeCmd is `cubicle volume`: persistent volumes of the workspace
// and their snapshots.
func newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "volume",
		Aliases: []string{"volumes", "vol"},
		Short:   "Create, list, snapshot and remove persistent volumes",
		Long: "Persistent volumes outlive sandboxes and can be attached to many at once\n" +
			"(cubicle sandbox create --volume NAME:/data[:ro]); they share one directory.",
	}
	cmd.AddCommand(newVolumeCreateCmd(), newVolumeLsCmd(), newVolumeRmCmd(), newVolumeSnapshotCmd())
	return cmd
}

func newVolumeCreateCmd() *cobra.Command {
	var size, from string
	cmd := &cobra.Command{
		Use:   "create NAME --size 10GiB | --from-snapshot SNAPSHOT",
		Short: "Create an empty volume, or a copy-on-write clone of a volume snapshot, and print its name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := protocol.CreateVolumeRequest{Name: args[0], FromSnapshot: from}
			if size != "" {
				n, err := parseByteSize(size)
				if err != nil {
					return fmt.Errorf("--size: %w", err)
				}
				req.SizeBytes = n
			}
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), req)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.Name)
			return nil
		},
	}
	cmd.Flags().StringVar(&size, "size", "", "size limit, e.g. 10GiB (default with --from-snapshot: the snapshot's)")
	cmd.Flags().StringVar(&from, "from-snapshot", "", "clone this volume snapshot")
	return cmd
}

func newVolumeLsCmd() *cobra.Command {
	var snapshots bool
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List volumes (or, with --snapshots, volume snapshots)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			if snapshots {
				list, err := c.ListVolumeSnapshots(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintln(tw, "NAME\tVOLUME\tSIZE\tUSED\tCREATED")
				for _, s := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, s.VolumeName, humanize.IBytes(uint64(s.SizeBytes)), usedBytes(s.UsedBytes), humanize.Time(s.CreatedAt))
				}
				return tw.Flush()
			}
			list, err := c.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tATTACHED TO\tCREATED")
			for _, v := range list {
				var uses []string
				for _, u := range v.Attachments {
					use := u.SandboxName + ":" + u.MountPath
					if u.ReadOnly {
						use += ":ro"
					}
					uses = append(uses, use)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", v.Name, humanize.IBytes(uint64(v.SizeBytes)), usedBytes(v.UsedBytes),
					orDash(strings.Join(uses, ",")), humanize.Time(v.CreatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&snapshots, "snapshots", false, "list volume snapshots")
	return cmd
}

// usedBytes prints a measured size, or - when unmeasured.
func usedBytes(n *int64) string {
	if n == nil {
		return "-"
	}
	return humanize.IBytes(uint64(*n))
}

func newVolumeRmCmd() *cobra.Command {
	var snapshot bool
	cmd := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove volumes and their data (refused while attached), or with --snapshot volume snapshots",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			for _, name := range args {
				rm := c.DeleteVolume
				if snapshot {
					rm = c.DeleteVolumeSnapshot
				}
				if err := rm(cmd.Context(), name); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&snapshot, "snapshot", false, "the names are volume snapshots")
	return cmd
}

func newVolumeSnapshotCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot VOLUME NAME",
		Short: "Take a read-only copy-on-write snapshot of a volume (clone it with volume create --from-snapshot)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			s, err := c.SnapshotVolume(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.Name)
			return nil
		},
	}
}

// parseVolumeFlag reads --volume NAME:/path[:ro|:rw].
func parseVolumeFlag(s string) (protocol.VolumeAttachment, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return protocol.VolumeAttachment{}, fmt.Errorf("--volume %q: want NAME:/path[:ro]", s)
	}
	a := protocol.VolumeAttachment{Name: parts[0], MountPath: parts[1]}
	if len(parts) == 3 {
		switch parts[2] {
		case "ro":
			a.ReadOnly = true
		case "rw":
		default:
			return a, fmt.Errorf("--volume %q: the mode must be ro or rw", s)
		}
	}
	return a, nil
}

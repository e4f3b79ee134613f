package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Tenancy commands: workspace, user, key, whoami, access-log. Each talks
// to the daemon through sdk/go.

// table writes a header and rows through a tabwriter.
func table(w io.Writer, header string, rows func(tw io.Writer)) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	rows(tw)
	return tw.Flush()
}

// clientRun wraps a command body that needs the SDK client.
func clientRun(fn func(cmd *cobra.Command, c *cubicle.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := clientFromEnv()
		if err != nil {
			return err
		}
		return fn(cmd, c, args)
	}
}

func newWorkspaceCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "workspace", Aliases: []string{"workspaces"}, Short: "Create, list and remove workspaces (instance admin)"}
	cmd.AddCommand(
		&cobra.Command{
			Use: "create NAME", Short: "Create a workspace and print its id", Args: cobra.ExactArgs(1),
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, args []string) error {
				w, err := c.CreateWorkspace(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), w.ID)
				return nil
			}),
		},
		&cobra.Command{
			Use: "ls", Aliases: []string{"list"}, Short: "List workspaces", Args: cobra.NoArgs,
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, _ []string) error {
				ws, err := c.ListWorkspaces(cmd.Context())
				if err != nil {
					return err
				}
				return table(cmd.OutOrStdout(), "ID\tNAME\tCREATED", func(tw io.Writer) {
					for _, w := range ws {
						fmt.Fprintf(tw, "%s\t%s\t%s\n", w.ID, w.Name, ago(w.CreatedAt))
					}
				})
			}),
		},
		&cobra.Command{
			Use: "rm ID|NAME...", Aliases: []string{"delete"}, Short: "Delete empty workspaces", Args: cobra.MinimumNArgs(1),
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, args []string) error {
				return forEachArg(cmd, args, func(ref string) error { return c.DeleteWorkspace(cmd.Context(), ref) })
			}),
		},
	)
	return cmd
}

func newUserCmd() *cobra.Command {
	var ws, email string
	cmd := &cobra.Command{Use: "user", Aliases: []string{"users"}, Short: "Create, list and remove a workspace's users"}
	cmd.PersistentFlags().StringVar(&ws, "workspace", "", "workspace id or name (instance admin; default: your own)")
	create := &cobra.Command{
		Use: "create NAME", Short: "Create a user and print its id", Args: cobra.ExactArgs(1),
		RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, args []string) error {
			u, err := c.CreateUser(cmd.Context(), protocol.CreateUserRequest{Name: args[0], Email: email, WorkspaceID: ws})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), u.ID)
			return nil
		}),
	}
	create.Flags().StringVar(&email, "email", "", "the user's email address")
	cmd.AddCommand(create,
		&cobra.Command{
			Use: "ls", Aliases: []string{"list"}, Short: "List users", Args: cobra.NoArgs,
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, _ []string) error {
				us, err := c.ListUsers(cmd.Context(), ws)
				if err != nil {
					return err
				}
				return table(cmd.OutOrStdout(), "ID\tNAME\tEMAIL\tCREATED", func(tw io.Writer) {
					for _, u := range us {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.ID, u.Name, orDash(u.Email), ago(u.CreatedAt))
					}
				})
			}),
		},
		&cobra.Command{
			Use: "rm ID...", Aliases: []string{"delete"}, Short: "Delete users and revoke their keys", Args: cobra.MinimumNArgs(1),
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, args []string) error {
				return forEachArg(cmd, args, func(id string) error { return c.DeleteUser(cmd.Context(), ws, id) })
			}),
		},
	)
	return cmd
}

type keyCreateFlags struct {
	name, user, role string
	expires          time.Duration
}

func newKeyCmd() *cobra.Command {
	var ws string
	var f keyCreateFlags
	cmd := &cobra.Command{Use: "key", Aliases: []string{"keys"}, Short: "Create, list and revoke API keys"}
	cmd.PersistentFlags().StringVar(&ws, "workspace", "", "workspace id or name (instance admin; default: your own)")
	create := &cobra.Command{
		Use:   "create --role admin|member",
		Short: "Create an API key and print it (shown only once)",
		Args:  cobra.NoArgs,
		RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, _ []string) error {
			req := protocol.CreateKeyRequest{Name: f.name, UserID: f.user, Role: f.role, WorkspaceID: ws}
			if f.expires > 0 {
				secs := int64((f.expires + time.Second - 1) / time.Second)
				req.ExpiresInSeconds = &secs
			}
			k, err := c.CreateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			expires := "never"
			if k.ExpiresAt != nil {
				expires = k.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s (%s, %s of user %s in workspace %s, expires %s)\n"+
				"This key is shown only once: store it now; it cannot be retrieved later.\n",
				k.ID, k.Prefix, k.Role, k.UserID, k.WorkspaceID, expires)
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			return nil
		}),
	}
	fl := create.Flags()
	fl.StringVar(&f.role, "role", "member", "role of the key: admin or member")
	fl.StringVar(&f.name, "name", "", "a name for the key")
	fl.StringVar(&f.user, "user", "", "id of the user the key acts as (default: yourself)")
	fl.DurationVar(&f.expires, "expires", 0, "lifetime, e.g. 720h (default: never expires)")
	cmd.AddCommand(create,
		&cobra.Command{
			Use: "ls", Aliases: []string{"list"}, Short: "List keys (a member: its own)", Args: cobra.NoArgs,
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, _ []string) error {
				ks, err := c.ListKeys(cmd.Context(), ws)
				if err != nil {
					return err
				}
				return table(cmd.OutOrStdout(), "ID\tPREFIX\tNAME\tROLE\tUSER\tSTATE\tCREATED", func(tw io.Writer) {
					for _, k := range ks {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, orDash(k.Prefix), orDash(k.Name), k.Role, k.UserID, keyState(k), ago(k.CreatedAt))
					}
				})
			}),
		},
		&cobra.Command{
			Use: "rm ID...", Aliases: []string{"revoke", "delete"}, Short: "Revoke keys (effective at once)", Args: cobra.MinimumNArgs(1),
			RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, args []string) error {
				return forEachArg(cmd, args, func(id string) error { return c.RevokeKey(cmd.Context(), ws, id) })
			}),
		},
	)
	return cmd
}

// keyState says whether k works: active, revoked, expired, or when it
// expires.
func keyState(k protocol.Key) string {
	switch {
	case k.RevokedAt != nil:
		return "revoked"
	case k.ExpiresAt == nil:
		return "active"
	case !time.Now().Before(*k.ExpiresAt):
		return "expired"
	default:
		return "expires " + k.ExpiresAt.Format(time.RFC3339)
	}
}

func newWhoAmICmd() *cobra.Command {
	return &cobra.Command{
		Use: "whoami", Short: "Show the user, workspace and role of CUBICLE_API_KEY", Args: cobra.NoArgs,
		RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, _ []string) error {
			me, err := c.WhoAmI(cmd.Context())
			if err != nil {
				return err
			}
			role := me.Role
			if me.InstanceAdmin {
				role += " (instance admin)"
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "user:      %s (%s)\n", me.User.Name, me.User.ID)
			fmt.Fprintf(w, "workspace: %s (%s)\n", me.Workspace.Name, me.Workspace.ID)
			fmt.Fprintf(w, "role:      %s\nkey:       %s\n", role, orDash(me.KeyPrefix))
			return nil
		}),
	}
}

func newAccessLogCmd() *cobra.Command {
	var q cubicle.AccessQuery
	var since time.Duration
	cmd := &cobra.Command{
		Use:     "access-log",
		Aliases: []string{"audit-access"},
		Short:   "Show the access audit: who did what to which resource (workspace admins)",
		Args:    cobra.NoArgs,
		RunE: clientRun(func(cmd *cobra.Command, c *cubicle.Client, _ []string) error {
			if since > 0 {
				q.Since = time.Now().Add(-since)
			}
			page, err := c.AccessLog(cmd.Context(), q)
			if err != nil {
				return err
			}
			err = table(cmd.OutOrStdout(), "SEQ\tTIME\tUSER\tKEY\tWHAT\tRESOURCE\tSTATUS\tFROM", func(tw io.Writer) {
				for _, r := range page.Items {
					what := r.Action
					if what == "" {
						what = r.Route
					}
					res := r.ResourceKind
					if r.Resource != "" {
						res += " " + r.Resource
					}
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.Seq, r.Time.Format(time.RFC3339), orDash(r.UserID), orDash(r.KeyPrefix),
						what, orDash(res), r.Status, orDash(r.Remote))
				}
			})
			if err != nil {
				return err
			}
			if page.NextCursor != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "(more: --cursor %s)\n", *page.NextCursor)
			}
			return nil
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&q.Sandbox, "sandbox", "", "only records naming this sandbox (name or id)")
	fl.StringVar(&q.User, "user", "", "only records of this user id")
	fl.DurationVar(&since, "since", 0, "only records from this long ago on, e.g. 24h")
	fl.StringVar(&q.Cursor, "cursor", "", "continue from a previous page's cursor")
	fl.IntVar(&q.Limit, "limit", 100, "records per page (1-500)")
	fl.StringVar(&q.WorkspaceID, "workspace", "", "workspace id, or * for all (instance admin)")
	return cmd
}

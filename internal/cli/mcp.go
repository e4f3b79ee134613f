package cli

import (
	"io"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	cubiclemcp "github.com/cubicle-dev/cubicle/internal/mcp"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// newMCPCmd is `cubicle mcp`: an MCP server on stdin/stdout for an agent
// host that spawns it, acting on the daemon at CUBICLE_ENDPOINT with
// CUBICLE_API_KEY through the MCP door.
func newMCPCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve Cubicle's tools to an agent over the Model Context Protocol (stdio)",
		Long: "Runs an MCP server on stdin/stdout, for an MCP host (Claude Desktop, an IDE, an agent framework) to spawn.\n" +
			"Its tools act on the daemon at $" + envEndpoint + " with $" + envAPIKey + ", exactly as that key may.\n" +
			"Logs go to stderr. The daemon also serves MCP over streamable HTTP at <endpoint>/mcp.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := clientFromEnv(cubicle.WithDoor(protocol.DoorMCP))
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: slog.LevelWarn}))
			t := &mcp.IOTransport{Reader: io.NopCloser(cmd.InOrStdin()), Writer: nopWriteCloser{cmd.OutOrStdout()}}
			return cubiclemcp.Serve(cmd.Context(), c, t, log)
		},
	}
}

// nopWriteCloser leaves stdout open when the MCP session ends.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

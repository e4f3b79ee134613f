package agent

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strconv"
)

// DefaultListen is the address PID 1 serves the agent API on.
var DefaultListen = net.JoinHostPort("0.0.0.0", strconv.Itoa(Port))

// Main is the `agent` role, PID 1 inside every sandbox, for the binaries
// that have it (cubicle-agent, and cubicle itself): the token comes only
// from standard input (see ReadToken), never the environment or argv,
// which root inside can read in /proc/1; logs go to stderr (every command
// with verbose); it serves on listen until SIGTERM.
func Main(ctx context.Context, listen string, verbose bool) error {
	token, err := ReadToken(os.Stdin)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return Run(ctx, listen, token, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
}

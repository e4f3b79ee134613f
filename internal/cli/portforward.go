package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// newPortForwardCmd is `cubicle port-forward`: local TCP ports relayed to
// ports inside a sandbox over one tunnel session, like `kubectl
// port-forward`.
func newPortForwardCmd() *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward NAME [LOCAL:]REMOTE...",
		Short: "Forward local ports to ports inside a sandbox",
		Long: "Listen on each LOCAL port (the REMOTE port when LOCAL is omitted, a free port\n" +
			"for 0) and relay every connection to REMOTE inside the sandbox through a tunnel.\n" +
			"Runs until interrupted, or until the sandbox stops or is deleted.",
		Example: "  cubicle port-forward box 8080\n" +
			"  cubicle port-forward box 5433:5432 0:6379",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			specs, err := parsePortSpecs(args[1:])
			if err != nil {
				return err
			}
			c, err := clientFromEnv()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			t, err := c.OpenTunnel(ctx, args[0])
			if err != nil {
				return err
			}
			defer t.Close()
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			errs := make(chan error, len(specs))
			for _, p := range specs {
				ln, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(p.local)))
				if err != nil {
					return fmt.Errorf("listen for port %d: %w", p.remote, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "Forwarding from %s -> %d\n", ln.Addr(), p.remote)
				go func() {
					errs <- t.Forward(ctx, ln, p.remote, func(err error) { fmt.Fprintln(cmd.ErrOrStderr(), "cubicle:", err) })
				}()
			}
			select {
			case <-ctx.Done():
				return nil // interrupted
			case <-t.Done():
				return errors.New("tunnel closed: the sandbox stopped or was deleted")
			case err := <-errs:
				return err
			}
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}

// portSpec is one LOCAL:REMOTE pair.
type portSpec struct{ local, remote int }

// parsePortSpecs parses [LOCAL:]REMOTE arguments.
func parsePortSpecs(args []string) ([]portSpec, error) {
	var out []portSpec
	for _, a := range args {
		l, r, ok := strings.Cut(a, ":")
		if !ok {
			l, r = a, a
		}
		local, err1 := strconv.Atoi(l)
		remote, err2 := strconv.Atoi(r)
		if err1 != nil || err2 != nil || local < 0 || local > 65535 || remote < 1 || remote > 65535 {
			return nil, fmt.Errorf("port %q: want [LOCAL:]REMOTE with LOCAL 0-65535 and REMOTE 1-65535", a)
		}
		out = append(out, portSpec{local: local, remote: remote})
	}
	return out, nil
}

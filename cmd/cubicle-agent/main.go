// Command cubicle-agent is what runs inside a sandbox, bound read-only at
// /.cubicle/cubicle: PID 1 (`agent`), sudo (when run by that name) and
// `set-identity`, the same roles as in the cubicle binary, and a microVM
// guest's /init (see package guest). It exists
// because a sandbox's boot waits for PID 1 to answer, and under gVisor
// every page the Go runtime and the package inits touch is a fault the
// Sentry serves: this binary is a twelfth of cubicle's size and answers
// tens of milliseconds sooner. The daemon uses it when it ships beside
// cubicle (make build puts both in bin/), else cubicle itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/microvm/guest"
)

func main() {
	if guest.IsInit() {
		guest.Run()
	}
	if filepath.Base(os.Args[0]) == "sudo" {
		os.Exit(agent.SudoMain(os.Args[1:]))
	}
	os.Exit(run(context.Background(), os.Args[1:], os.Stderr))
}

const usage = "usage: cubicle-agent agent [--listen ADDR] [-v] | set-identity HOSTNAME MACHINE_ID | (as sudo) sudo ..."

// run is one role's command line; it returns the exit code (2 for a bad
// command line).
func run(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "agent":
		fs := flag.NewFlagSet("agent", flag.ContinueOnError)
		fs.SetOutput(stderr)
		listen := fs.String("listen", agent.DefaultListen, "address to serve the agent API on")
		verbose := fs.Bool("verbose", false, "log every command")
		fs.BoolVar(verbose, "v", false, "log every command")
		if fs.Parse(args[1:]) != nil || fs.NArg() != 0 {
			fmt.Fprintln(stderr, usage)
			return 2
		}
		err = agent.Main(ctx, *listen, *verbose)
	case "set-identity":
		if len(args) != 3 {
			fmt.Fprintln(stderr, usage)
			return 2
		}
		err = runtime.ApplyIdentity(ctx, args[1], args[2])
	default:
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "cubicle-agent %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

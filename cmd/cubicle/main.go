// Command cubicle is Cubicle's single binary: the daemon (serve), the
// in-sandbox agent (agent) and the CLI (everything else).
package main

import (
	"os"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/cli"
	"github.com/cubicle-dev/cubicle/internal/runtime/microvm/guest"
)

func main() {
	if guest.IsInit() {
		guest.Run()
	}
	if filepath.Base(os.Args[0]) == "sudo" {
		// Inside a sandbox, sudo is this binary (see agent.SudoMain).
		os.Exit(agent.SudoMain(os.Args[1:]))
	}
	os.Exit(cli.Main(os.Args[1:]))
}

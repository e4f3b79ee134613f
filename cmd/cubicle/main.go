// Command cubicle is Cubicle's single binary: the daemon (serve), the
// in-sandbox agent (agent) and the CLI (everything else).
package main

import (
	"os"

	"github.com/cubicle-dev/cubicle/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:]))
}

package cubicle_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// A whole round trip: build a snapshot, boot a sandbox from it, stream a
// command, move a file in and out, and clean up.
func Example() {
	ctx := context.Background()
	c := cubicle.New("http://127.0.0.1:8080", os.Getenv("CUBICLE_API_KEY"))

	snap, err := c.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{
		Name: "py", DockerImage: "python:3.12-slim", FSCapacityBytes: 10 << 30,
	})
	if err != nil {
		panic(err)
	}
	if _, err := c.WaitSnapshot(ctx, snap.ID, nil); err != nil {
		panic(err)
	}
	sb, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: snap.ID})
	if err != nil {
		panic(err)
	}
	defer c.DeleteSandbox(ctx, sb.Name)

	if err := c.WriteFile(ctx, sb.Name, "/work/hello.py", strings.NewReader("print('hi')\n")); err != nil {
		panic(err)
	}
	code, err := c.Exec(ctx, sb.Name, cubicle.ExecRequest{
		Command: "python /work/hello.py", Stdout: os.Stdout, Stderr: os.Stderr,
	})
	fmt.Println(code, err)
}

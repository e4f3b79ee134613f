package agent

import (
	"context"
	"io"
	"testing"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// BenchmarkExecTrue is the round trip of `true` through Client.Exec: dial,
// fork/exec, exit frame.
func BenchmarkExecTrue(b *testing.B) {
	c, _, _ := startAgent(b)
	ctx := context.Background()
	req := protocol.ExecFrame{Command: "true", Shell: "/bin/sh", CloseStdin: true}
	for b.Loop() {
		code, err := c.Exec(ctx, req, io.Discard, io.Discard)
		if err != nil || code != 0 {
			b.Fatal(code, err)
		}
	}
}

// BenchmarkHealth is one authenticated HTTP round trip on a kept-alive
// connection.
func BenchmarkHealth(b *testing.B) {
	c, _, _ := startAgent(b)
	ctx := context.Background()
	for b.Loop() {
		if err := c.Health(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

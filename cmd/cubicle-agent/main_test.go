package main

import (
	"context"
	"strings"
	"testing"
)

// TestRunRefusesBadCommandLines: an unknown role, a missing one, stray
// arguments and a wrong set-identity arity are exit 2 with the usage, and
// run nothing.
func TestRunRefusesBadCommandLines(t *testing.T) {
	for _, args := range [][]string{nil, {"serve"}, {"agent", "extra"}, {"agent", "--nope"}, {"set-identity", "host"}} {
		var out strings.Builder
		if code := run(context.Background(), args, &out); code != 2 {
			t.Errorf("run(%q) = %d, want 2", args, code)
		}
		if !strings.Contains(out.String(), "usage: cubicle-agent") {
			t.Errorf("run(%q) printed %q, want the usage", args, out.String())
		}
	}
}

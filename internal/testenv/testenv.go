// Package testenv decides what a test does when its host lacks something
// it needs (root, a tool): on a developer's machine it is skipped, saying
// why; under CI (CI set in the environment, as .ci/run does) it fails.
// CI hosts run as root and install every tool the tests use, so there a
// missing capability is a broken host, and a test must not pass by not
// running.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI.
func InCI() bool { return os.Getenv("CI") != "" }

// Skip skips tb with the reason, or fails it under CI.
func Skip(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		tb.Fatalf("%s (CI must provide this; skipping is only for hosts outside CI)", msg)
	}
	tb.Skip(msg)
}

// RequireRoot skips (fails under CI) unless the test runs as root; why
// says what root is needed for.
func RequireRoot(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Skip(tb, "needs root: %s", why)
	}
}

// RequireTool returns the path of the named executable, skipping (failing
// under CI) when it is not installed.
func RequireTool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Skip(tb, "%s not installed: %v", name, err)
	}
	return p
}

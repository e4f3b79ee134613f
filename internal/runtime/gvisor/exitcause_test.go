package gvisor

import (
	"os"
	"path/filepath"
	"testing"
)

// TestExitCause names the process whose death the Sentry logged first.
func TestExitCause(t *testing.T) {
	d, err := New("/bin/true", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id := "0123456789abcdef0123456789abcdef"
	if got := d.ExitCause(id); got != "" {
		t.Errorf("cause without a log: %q", got)
	}
	for log, want := range map[string]string{
		"": "its Sentry (the runsc sandbox process) was killed",
		"I1201 loader.go:1648] Gofer socket disconnected, killing container \"x\"\nI1201 boot.go:779] application exiting with killed by signal 9\n":                                                                        "its gofer (the runsc process serving its files) died",
		"I1201 boot.go:779] application exiting with killed by signal 9\nI1201 cli.go:317] Exiting with status: 9\n":                                                                                                        "its PID 1 (the agent) was killed by signal 9",
		"I1201 loader.go:1648] Gofer socket disconnected\nI1201 boot.go:779] application exiting with exit status 2\n":                                                                                                      "its PID 1 (the agent) exited: exit status 2",
		"W1201 task_run.go:365] Unexpected SwitchToApp error: systrap corrupted memory: subprocess died\nI1201 loader.go:1648] Gofer socket disconnected\nI1201 boot.go:779] application exiting with killed by signal 9\n": "a systrap stub process of its Sentry was killed",
	} {
		os.MkdirAll(d.bundleDir(id), 0o700)
		if err := os.WriteFile(filepath.Join(d.bundleDir(id), sentryLog), []byte(log), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := d.ExitCause(id); got != want {
			t.Errorf("log %q: cause %q, want %q", log, got, want)
		}
	}
}

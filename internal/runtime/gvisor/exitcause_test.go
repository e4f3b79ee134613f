package gvisor

import (
	"os"
	"path/filepath"
	"testing"
	"time"
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
	// PID 1 SIGKILLed: the container and its gofer end, the gofer in
	// order; the Sentry may log the disconnect first.
	both := "I1201 loader.go:1648] Gofer socket disconnected, killing container \"x\"\nI1201 boot.go:779] application exiting with killed by signal 9\n"
	if err := os.WriteFile(filepath.Join(d.bundleDir(id), sentryLog), []byte(both), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.bundleDir(id), goferLog), []byte("I1201 gofer.go:513] All lisafs servers exited.\nI1201 cli.go:317] Exiting with status: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := d.ExitCause(id), "its PID 1 (the agent) was killed by signal 9"; got != want {
		t.Errorf("disconnect logged, gofer exited in order: cause %q, want %q", got, want)
	}
	// The gofer's orderly exit lands in its log a little after the
	// Sentry's: the cause waits for it rather than blaming the gofer.
	gofer := filepath.Join(d.bundleDir(id), goferLog)
	if err := os.WriteFile(gofer, []byte("I1201 gofer.go:513] All lisafs servers exited.\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		os.WriteFile(gofer, []byte("I1201 gofer.go:513] All lisafs servers exited.\nI1201 cli.go:317] Exiting with status: 0\n"), 0o600)
	}()
	if got, want := d.ExitCause(id), "its PID 1 (the agent) was killed by signal 9"; got != want {
		t.Errorf("gofer exit logged 100 ms late: cause %q, want %q", got, want)
	}
}

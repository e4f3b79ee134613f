package fault

import (
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestHit: an unarmed or nil injector never fires; an armed one ignores
// other points and kills the process (SIGKILL) at its own.
func TestHit(t *testing.T) {
	if os.Getenv("FAULT_TEST_CHILD") == "1" {
		i := FromEnv(slog.New(slog.DiscardHandler))
		i.Hit("other.point")
		os.Stdout.WriteString("passed other\n")
		i.Hit(StopHalted)
		os.Stdout.WriteString("passed armed\n")
		os.Exit(0)
	}
	var nilInj *Injector
	nilInj.Hit(StopHalted) // no-op
	t.Setenv(EnvVar, "")
	if FromEnv(slog.New(slog.DiscardHandler)) != nil {
		t.Fatal("an injector without the variable")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHit$")
	cmd.Env = append(os.Environ(), "FAULT_TEST_CHILD=1", EnvVar+"="+StopHalted)
	out, err := cmd.Output()
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child exit %v, want killed", err)
	}
	if string(out) != "passed other\n" {
		t.Fatalf("child output %q: want it killed at the armed point only", out)
	}
}

package testenv

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestSkipFailsUnderCI runs a test that lacks a tool twice, in a child
// process: without CI it is skipped with the reason, with CI=1 it fails.
func TestSkipFailsUnderCI(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") != "" {
		RequireTool(t, "no-such-tool-cubicle")
		t.Fatal("RequireTool returned for a missing tool")
	}
	for _, c := range []struct {
		ci   string
		fail bool
		want string
	}{{"", false, "--- SKIP"}, {"1", true, "--- FAIL"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSkipFailsUnderCI$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTENV_CHILD=1", "CI="+c.ci)
		out, err := cmd.CombinedOutput()
		if (err != nil) != c.fail || !strings.Contains(string(out), c.want) || !strings.Contains(string(out), "no-such-tool-cubicle not installed") {
			t.Errorf("CI=%q: err %v, output:\n%s", c.ci, err, out)
		}
	}
}

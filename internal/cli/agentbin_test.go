package cli

import (
	"os"
	"path/filepath"
	"testing"
)

// TestAgentBinary: sandboxes get the small cubicle-agent when it ships
// beside the daemon as an executable, else the daemon's own binary.
func TestAgentBinary(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "cubicle")
	small := filepath.Join(dir, "cubicle-agent")
	if got := agentBinary(self); got != self {
		t.Fatalf("without cubicle-agent: %s, want %s", got, self)
	}
	if err := os.WriteFile(small, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := agentBinary(self); got != self {
		t.Fatalf("with a non-executable cubicle-agent: %s, want %s", got, self)
	}
	if err := os.Chmod(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := agentBinary(self); got != small {
		t.Fatalf("with cubicle-agent: %s, want %s", got, small)
	}
}

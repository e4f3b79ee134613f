package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// mcpClientVersion is the official TypeScript MCP client the test drives
// Cubicle's MCP door with.
const mcpClientVersion = "@modelcontextprotocol/sdk@1.32.2"

// TestMCPOfficialClient: the official TypeScript MCP client, unmodified,
// drives a full session (tools and their schemas, create, write, run,
// page, a long-running command, fork, diff, a file resource, the audit
// record showing door "mcp", delete) over stdio (`cubicle mcp`) and over
// the gvisor daemon's streamable-HTTP /mcp, and the HTTP door refuses a
// missing or bad key, another workspace's key and a hijacked session
// (testdata/mcp-client.mjs).
func TestMCPOfficialClient(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "mcp-base", ref)
	other := addKey(t, d, "ws-mcp-other", "eve", store.RoleAdmin)
	dir := npmPackages(t, "npm-mcp", mcpClientVersion)
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "test", "e2e", "testdata", "mcp-client.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "mcp-client.mjs")
	if err := os.WriteFile(script, data, 0o644); err != nil {
		t.Fatal(err)
	}
	bin, _ := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CUBICLE_BIN="+bin, "CUBICLE_ENDPOINT="+d.Endpoint, "CUBICLE_API_KEY="+testKey,
		"OTHER_KEY="+other, "SNAPSHOT="+sn.ID)
	out, err := cmd.CombinedOutput()
	t.Logf("mcp client output:\n%s", out)
	if err != nil || !strings.Contains(string(out), "MCP PASSED") {
		t.Fatalf("the MCP session failed: %v", err)
	}
	// Both sessions cleaned up after themselves.
	l, err := d.Client.ListSandboxes(ctx, cubicle.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Sandboxes) != 0 {
		t.Errorf("sandboxes left behind: %d", len(l.Sandboxes))
	}
}

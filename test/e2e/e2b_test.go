package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// e2bSDKVersion is the e2b npm SDK the door is tested against.
const e2bSDKVersion = "2.51.0"

// e2bDir installs the official e2b SDK under .cache (once).
func e2bDir(t *testing.T) string {
	return npmPackages(t, "npm-e2b-"+e2bSDKVersion, "e2b@"+e2bSDKVersion)
}

// TestE2BSDK drives the unmodified e2b SDK, pointed at the daemon's E2B
// door by its own environment variables, through every flow the door
// serves (test/conformance/e2b-sdk.mjs), then checks that the commands
// it ran are in the sandbox's audit record as having come through the
// e2b door.
func TestE2BSDK(t *testing.T) {
	ref := testImage(t)
	door := freePort(t)
	d := startDaemonEnv(t, "gvisor", "", []string{"CUBICLE_TTL_GRANULARITY=1s", "CUBICLE_REAP_INTERVAL=250ms"}, "--e2b-listen", door)
	readySnapshot(t, d.Client, "e2b-base", ref)
	dir := e2bDir(t)
	script := filepath.Join(repoRoot(t), "test", "conformance", "e2b-sdk.mjs")
	data, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "e2b-sdk.mjs")
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+door, "E2B_SANDBOX_URL=http://"+door,
		"E2B_API_KEY="+testKey, "E2B_TEMPLATE=e2b-base")
	out, err := cmd.CombinedOutput()
	t.Logf("e2b SDK script:\n%s", out)
	if err != nil || !strings.Contains(string(out), "E2B PASSED") {
		t.Fatalf("e2b SDK script failed: %v", err)
	}
	m := regexp.MustCompile(`SANDBOX (\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatal("script named no sandbox")
	}
	name := string(m[1])
	assertDoorEvent(t, d.Client, name, protocol.KindCommand, "command", "echo hello-e2b; echo oops >&2", "e2b")
	assertDoorEvent(t, d.Client, name, protocol.KindFile, "path", "/tmp/e2b/a.txt", "e2b")
}

// assertDoorEvent fails unless sandbox name's audit record holds a kind
// event whose data has field = want and came through door.
func assertDoorEvent(t *testing.T, c *cubicle.Client, name, kind, field, want, door string) {
	t.Helper()
	l, err := c.Audit(context.Background(), name, cubicle.AuditOptions{Kinds: []string{kind}, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, ev := range l.Items {
		var data map[string]any
		if json.Unmarshal(ev.Data, &data) != nil {
			continue
		}
		if data[field] == want && data["door"] == door {
			return
		}
		seen = append(seen, fmt.Sprintf("%v: %v", data["door"], data[field]))
	}
	t.Fatalf("no %s event with %s %q through door %q in the record of %s; saw %q", kind, field, want, door, name, seen)
}

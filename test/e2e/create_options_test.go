package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCreateOptionsOfficialClient: the official npm client 0.12 against
// the daemon with the 0.12 create and list options — labels filtered and
// inherited, persistent: false, snapshot tags and name:tag, cpu_millicores,
// cursor paging sorted by name with created_by=me (testdata/create-options.mjs).
func TestCreateOptionsOfficialClient(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "namespace", "")
	sn := readySnapshot(t, d.Client, "opts-base", ref)
	out := runNodeScript(t, "create-options.mjs", "LANGSMITH_ENDPOINT="+d.Endpoint, "LANGSMITH_API_KEY="+testKey, "OPTS_SNAPSHOT="+sn.ID)
	if !strings.Contains(out, "CREATE OPTIONS CLIENT PASSED") {
		t.Fatal("the official client's create-options script did not pass")
	}
	// cpu_millicores: 500 is the CFS quota of the sandbox's cgroup.
	sb, err := d.Client.GetSandbox(context.Background(), "opt-d")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/sys/fs/cgroup/cpu/cubicle", strings.ReplaceAll(sb.ID, "-", ""))
	quota, qerr := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
	period, perr := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
	if qerr != nil || perr != nil || strings.TrimSpace(string(quota))+"/"+strings.TrimSpace(string(period)) != "50000/100000" {
		t.Fatalf("cgroup of opt-d: quota %q (%v) period %q (%v), want 50000/100000", quota, qerr, period, perr)
	}
}

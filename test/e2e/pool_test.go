package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// waitPool waits until snapshot id's pool has ready instances up.
func waitPool(t testing.TB, c *cubicle.Client, id string, ready int) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		p, err := c.SnapshotPool(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready == ready {
			return
		}
	}
	t.Fatalf("pool of %s never had %d ready instances", id, ready)
}

// poolClaims is cubicle_pool_claims_total{result} for snapshot snap.
func poolClaims(t testing.TB, d *daemon, snap, result string) float64 {
	t.Helper()
	_, fams := scrape(t, d.Endpoint+"/metrics", testKey)
	return sample(fams, "cubicle_pool_claims_total", map[string]string{"snapshot": snap, "result": result}).GetCounter().GetValue()
}

var machineID = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestWarmPool, on each runtime (microvm included: its agent sets the
// identity, runtime.AgentIdentifier): a create from a snapshot with a pool
// claims a pre-booted instance, which then is the record's — its name as hostname (and
// in /etc/hosts), a machine-id of its own, its env, the default limits,
// and an agent taking the record's token — while a create the pool cannot
// serve boots cold. A kill -9 of the daemon with a full pool leaves
// nothing behind once it restarts: the old instances are torn down and the
// pool refilled, the host holding exactly what it held before.
func TestWarmPool(t *testing.T) {
	for _, rt := range withMicroVM() {
		t.Run(rt, func(t *testing.T) { testWarmPool(t, rt) })
	}
}

func testWarmPool(t *testing.T, rt string) {
	ref := testImage(t)
	d := startDaemon(t, rt, "")
	c, ctx := d.Client, context.Background()
	base := readySnapshot(t, c, "base", ref)
	if _, err := c.SetSnapshotPool(ctx, base.ID, 2, 0); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, base.ID, 2)

	var ids []string
	for _, name := range []string{"hit-one", "hit-two"} {
		t0 := time.Now()
		sb := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) {
			r.Name, r.EnvVars = name, map[string]string{"GREETING": "hi " + name}
		})
		mustRun(t, c, name, "true")
		t.Logf("%s: pool hit, create → first exec answered in %v", name, time.Since(t0))
		lines := strings.Split(strings.TrimSpace(mustRun(t, c, name, `hostname; cat /etc/machine-id; echo "$GREETING"; grep -c "$(hostname)" /etc/hosts`)), "\n")
		if len(lines) != 4 || lines[0] != name || !machineID.MatchString(lines[1]) || lines[2] != "hi "+name || lines[3] != "1" {
			t.Fatalf("claimed %s: %q", name, lines)
		}
		if slices.Contains(ids, lines[1]) {
			t.Fatalf("%s shares a machine-id", name)
		}
		ids = append(ids, lines[1])
		if sb.VCPUs != 2 || sb.MemBytes != 1<<30 {
			t.Fatalf("claimed %s: vcpus %d mem %d", name, sb.VCPUs, sb.MemBytes)
		}
		if rt == "microvm" {
			// Its agent is the daemon's alone, over the VM's serial
			// port (the exec above used the record's token).
			wantNoAgentOnNetwork(t, agentAt(t, d, name))
		} else {
			wantAgentAuth(t, agentAt(t, d, name), agentToken(t, d, sb.ID), true, "the record's token")
		}
		waitPool(t, c, base.ID, 2)
	}
	if hits := poolClaims(t, d, base.ID, "hit"); hits != 2 {
		t.Fatalf("pool hits %v, want 2", hits)
	}
	t0 := time.Now()
	cold := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name, r.MemBytes = "cold", int64p(256<<20) })
	mustRun(t, c, cold.Name, "true")
	t.Logf("cold create → first exec answered in %v", time.Since(t0))
	if misses := poolClaims(t, d, base.ID, "miss"); misses != 1 {
		t.Fatalf("pool misses %v, want 1 (the 256 MiB create)", misses)
	}
	if got := strings.TrimSpace(mustRun(t, c, cold.Name, "hostname")); got != "cold" {
		t.Fatalf("cold hostname %q", got)
	}

	waitPool(t, c, base.ID, 2)
	// leakCounts counts cgroups too (v1 and v2).
	before := leakCounts(t, d)
	d.kill9()
	d.restart()
	waitPool(t, c, base.ID, 2)
	if after := leakCounts(t, d); after != before {
		t.Fatalf("after kill -9 and restart: %+v, before %+v", after, before)
	}
	if left, err := c.Leftovers(ctx); err != nil || len(left) != 0 {
		t.Fatalf("leftovers after the restart: %v %v", left, err)
	}
	for _, name := range []string{"hit-one", "cold"} {
		mustRun(t, c, name, "true")
	}
	if _, err := c.SetSnapshotPool(ctx, base.ID, 0, 0); err != nil {
		t.Fatal(err)
	}
	waitPool(t, c, base.ID, 0)
}

// TestPoolCreateLatency measures create → first output on gVisor, cold
// (no pool) and claiming from a full pool (refilled before each create, so
// no refill boot competes), median of 10 each, through the Go SDK and the
// official npm client, logging both and their ratio; a pool hit must be
// the faster.
func TestPoolCreateLatency(t *testing.T) {
	const n = 10
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	c, ctx := d.Client, context.Background()
	base := readySnapshot(t, c, "base", ref)
	setPool := func(size int64) {
		if _, err := c.SetSnapshotPool(ctx, base.ID, size, 0); err != nil {
			t.Fatal(err)
		}
		waitPool(t, c, base.ID, int(size))
	}
	// The baseline, measured in this run: bare `runsc run` of `echo hi`
	// in a fresh netns (BenchmarkBareRunsc/netns).
	layer := bareLayer(t)
	bareMedian := func() time.Duration {
		var ds []time.Duration
		for range n {
			ds = append(ds, bareRun(t, layer, true))
		}
		return median(ds)
	}
	report := func(client string, cold, hit, bare time.Duration) {
		t.Logf("create→first output (%s, gVisor, median of %d): cold %v, pool hit %v, hit/cold %.2f; bare runsc in a netns %v: hit/bare %.2f, cold/bare %.2f",
			client, n, cold, hit, float64(hit)/float64(cold), bare, float64(hit)/float64(bare), float64(cold)/float64(bare))
		if hit >= cold {
			t.Errorf("%s: a pool hit (%v) is no faster than a cold create (%v)", client, hit, cold)
		}
	}
	t.Run("go-sdk", func(t *testing.T) {
		measure := func(name string) time.Duration {
			start := time.Now()
			if _, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: base.ID, Name: name}); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if code, err := c.Exec(ctx, name, cubicle.ExecRequest{Command: "echo hi", Shell: "/bin/sh", Stdout: &out}); err != nil || code != 0 || out.String() != "hi\n" {
				t.Fatalf("exec: %d %v %q", code, err, out.String())
			}
			took := time.Since(start)
			if err := c.DeleteSandbox(ctx, name); err != nil {
				t.Fatal(err)
			}
			return took
		}
		var cold, hit []time.Duration
		setPool(0)
		for i := range n {
			cold = append(cold, measure(fmt.Sprintf("cold-%d", i)))
		}
		setPool(2)
		before := poolClaims(t, d, base.ID, "hit")
		for i := range n {
			waitPool(t, c, base.ID, 2)
			hit = append(hit, measure(fmt.Sprintf("hit-%d", i)))
		}
		if hits := poolClaims(t, d, base.ID, "hit") - before; hits != n {
			t.Fatalf("%v pool hits, want %d", hits, n)
		}
		report("Go SDK", median(cold), median(hit), bareMedian())
		_, fams := scrape(t, d.Endpoint+"/metrics", testKey)
		if h := sample(fams, "cubicle_pool_claim_duration_seconds", nil).GetHistogram(); h.GetSampleCount() > 0 {
			t.Logf("claim phase (identity, token, egress policy): mean %.1f ms over %d claims", 1000*h.GetSampleSum()/float64(h.GetSampleCount()), h.GetSampleCount())
		}
	})
	t.Run("official-client", func(t *testing.T) {
		runNode := func(prefix string, wait int) time.Duration {
			return officialCreateLatency(t, d, base.ID, prefix, n, wait)
		}
		setPool(0)
		cold := runNode("npm-cold", 0)
		setPool(2)
		hit := runNode("npm-hit", 2)
		report("official npm client", cold, hit, bareMedian())
	})
}

// officialCreateLatency runs testdata/pool-latency.mjs with the official
// npm client against d: n creates of snapshot snap, each named
// prefix-i, then run("echo hi"), waiting before each for wait ready pool
// instances when wait > 0; it returns the median create → first output.
func officialCreateLatency(tb testing.TB, d *daemon, snap, prefix string, n, wait int) time.Duration {
	dir := npmDir(tb, false)
	script, err := os.ReadFile(filepath.Join(repoRoot(tb), "test", "e2e", "testdata", "pool-latency.mjs"))
	if err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(dir, "pool-latency.mjs")
	if err := os.WriteFile(dst, script, 0o644); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", dst)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LANGSMITH_ENDPOINT="+d.Endpoint, "LANGSMITH_API_KEY="+testKey, "POOL_SNAPSHOT="+snap,
		fmt.Sprintf("POOL_N=%d", n), "POOL_PREFIX="+prefix, fmt.Sprintf("POOL_WAIT=%d", wait))
	out, err := cmd.CombinedOutput()
	tb.Logf("%s: %s", prefix, out)
	var ms float64
	if _, serr := fmt.Sscanf(string(out[bytes.LastIndex(out, []byte("MEDIAN")):]), "MEDIAN %g", &ms); err != nil || serr != nil {
		tb.Fatalf("official client (%s): %v %v", prefix, err, serr)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

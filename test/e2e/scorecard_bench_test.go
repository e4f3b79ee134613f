package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// scoreRow is one line of the scorecard: a figure, the baseline it is
// held against (measured in the same run), and the target ratio or bound
// ("" when the issue names none).
type scoreRow struct {
	what, baseline string
	value, base    float64 // base 0: no baseline, value is held to target alone
	unit, target   string
}

// BenchmarkScorecard prints issue 15's figures from one run, each next to
// its baseline measured in the same run, with their ratio and the target:
//
//	go test -run '^$' -bench Scorecard -benchtime 5x ./test/e2e/
//
// -benchtime Nx sets the rounds of the paired rows, each round taking
// every pair in turn so both sides see the same load: cold create → first
// output and a warm-pool hit (Go SDK) against a bare `runsc run` in a
// fresh netns; exec round trip against `runsc exec` into a bare container;
// a fork into 10 branches against a fork into 1. Then, once: the official
// npm client's cold and pool-hit create → first output; an idle
// sandbox's host memory (PSS) against a bare runsc container's; a burst
// of CUBICLE_BURST creates at once (default 100); and, on a second
// daemon serving the built-in default computer, CUBICLE_SCORECARD_IO
// rounds of the I/O matrix against a host chroot (default 1; 0 leaves it
// out: the first run builds the default computer, about a minute with a
// warm blueprint cache). The 256 MB download's row is BenchmarkDownload in
// internal/runtime/gvisor (it needs a host peer).
func BenchmarkScorecard(b *testing.B) {
	const execsPerRound = 10
	ioRounds := envInt(b, "CUBICLE_SCORECARD_IO", 1)
	burstN := envInt(b, "CUBICLE_BURST", 100)
	ctx := context.Background()
	layer := bareLayer(b)
	d := startDaemon(b, "gvisor", "")
	c := d.Client
	ref := testImage(b)
	cold := readySnapshot(b, c, "score-cold", ref)
	pooled := readySnapshot(b, c, "score-pool", ref)
	if _, err := c.SetSnapshotPool(ctx, pooled.ID, 2, 0); err != nil {
		b.Fatal(err)
	}
	box := newSandbox(b, c, cold.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "score-exec" })
	parent := newSandbox(b, c, cold.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "score-parent" })
	mustRun(b, c, parent.Name, "mkdir -p /data && dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null")
	bare := startBareIdle(b, layer)
	mustRun(b, c, box.Name, "true") // the agent's first exec is not a round trip's

	var coldD, hitD, bareD, execD, bareExecD, fork1D, fork10D []time.Duration
	for b.Loop() {
		bareD = append(bareD, bareRun(b, layer, true))
		t, _ := createToFirstOutput(b, c, cold.ID)
		coldD = append(coldD, t)
		waitPool(b, c, pooled.ID, 2)
		t, _ = createToFirstOutput(b, c, pooled.ID)
		hitD = append(hitD, t)
		for range execsPerRound {
			t0 := time.Now()
			mustRun(b, c, box.Name, "true")
			execD = append(execD, time.Since(t0))
			bareExecD = append(bareExecD, bare.exec(b))
		}
		fork1D = append(fork1D, forkReady(b, c, parent.Name, 1))
		fork10D = append(fork10D, forkReady(b, c, parent.Name, 10))
	}
	bareMed := ms(median(bareD))
	rows := []scoreRow{
		{"create → first output, cold (Go SDK)", "bare runsc run, fresh netns", ms(median(coldD)), bareMed, "ms", "≤ 1.3×"},
		{"create → first output, pool hit (Go SDK)", "bare runsc run, fresh netns", ms(median(hitD)), bareMed, "ms", "≤ 0.5×"},
	}

	waitPool(b, c, pooled.ID, 2)
	npmCold := officialCreateLatency(b, d, cold.ID, "score-npm-cold", 5, 0)
	npmHit := officialCreateLatency(b, d, pooled.ID, "score-npm-hit", 5, 2)
	rows = append(rows,
		scoreRow{"create → first output, cold (official npm client)", "bare runsc run, fresh netns", ms(npmCold), bareMed, "ms", "≤ 1.3×"},
		scoreRow{"create → first output, pool hit (official npm client)", "bare runsc run, fresh netns", ms(npmHit), bareMed, "ms", "≤ 0.5×"},
		scoreRow{"exec round trip (`true`)", "runsc exec into a bare container", ms(median(execD)), ms(median(bareExecD)), "ms", ""},
		scoreRow{"fork into 10 branches, all ready", "fork into 1", ms(median(fork10D)), ms(median(fork1D)), "ms", "≤ 1.5×"},
		scoreRow{"idle sandbox, host PSS", "bare runsc container, idle", float64(sandboxPSS(b, box.ID)) / (1 << 20), float64(bare.pss(b)) / (1 << 20), "MiB", ""},
	)

	// The burst: no pool refill competing, nothing but the two idle
	// sandboxes beside it.
	if _, err := c.SetSnapshotPool(ctx, pooled.ID, 0, 0); err != nil {
		b.Fatal(err)
	}
	waitPool(b, c, pooled.ID, 0)
	all, ready, first, errs := burstCreates(d, cold.ID, burstN)
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			b.Log(err)
		}
	}
	slices.Sort(first)
	rows = append(rows,
		scoreRow{fmt.Sprintf("%d creates at once, the last ready (%d failed)", burstN, failed), "", ms(slices.Max(ready)), 0, "ms", "≤ 10 s, none failing"},
		scoreRow{fmt.Sprintf("%d creates at once, create → first output p99", burstN), "", ms(pct(first, 99)), 0, "ms", ""},
		scoreRow{fmt.Sprintf("%d creates at once, all done", burstN), "", ms(all), 0, "ms", ""},
	)
	d.shutdown() // the I/O matrix's daemon uses the same address pool

	if ioRounds > 0 {
		io := startDaemonEnv(b, "gvisor", "", []string{"CUBICLE_DEFAULT_IMAGE=", "CUBICLE_BLUEPRINT_CACHE=" + blueprintCache()})
		m := newIOMatrix(b, io)
		sb, hc := make([][]time.Duration, len(ioWorkloads)), make([][]time.Duration, len(ioWorkloads))
		for range ioRounds {
			s, h := m.round(b)
			for i := range ioWorkloads {
				sb[i], hc[i] = append(sb[i], s[i]), append(hc[i], h[i])
			}
		}
		for i, w := range ioWorkloads {
			rows = append(rows, scoreRow{w.name + " (" + m.inputs[i] + " inputs) in the default computer", "host chroot of the same rootfs", ms(median(sb[i])), ms(median(hc[i])), "ms", "≤ 1.5×"})
		}
	}

	var table strings.Builder
	fmt.Fprintf(&table, "scorecard (gVisor, %d rounds for the paired rows; medians):\n", len(coldD))
	for _, r := range rows {
		fmt.Fprintf(&table, "  %-58s %9.1f %-3s", r.what, r.value, r.unit)
		if r.base > 0 {
			fmt.Fprintf(&table, "  vs %-36s %9.1f %-3s  %5.2f×", r.baseline, r.base, r.unit, r.value/r.base)
			b.ReportMetric(r.value/r.base, metricName(r.what)+"-ratio")
		} else {
			fmt.Fprintf(&table, "  %-64s", "")
		}
		if r.target != "" {
			fmt.Fprintf(&table, "  target %s", r.target)
		}
		table.WriteString("\n")
	}
	b.ReportMetric(0, "ns/op")
	// Printed, not logged: a benchmark's log is cut to its first lines.
	fmt.Print(table.String())
}

// metricName turns a scorecard row's label into a benchmark metric unit
// (no spaces).
func metricName(what string) string {
	f := strings.FieldsFunc(strings.ToLower(what), func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9')
	})
	return strings.Join(f, "-")
}

// forkReady forks sandbox name into n branches and returns the time until
// the fork answered with every branch ready; the branches and the
// snapshot are deleted afterwards, not timed.
func forkReady(tb testing.TB, c *cubicle.Client, name string, n int) time.Duration {
	ctx := context.Background()
	t0 := time.Now()
	res, err := c.Fork(ctx, name, protocol.ForkRequest{Count: n})
	took := time.Since(t0)
	if err != nil {
		tb.Fatal(err)
	}
	timer(tb, false)
	defer timer(tb, true)
	if len(res.Sandboxes) != n {
		tb.Fatalf("fork %d: %d branches", n, len(res.Sandboxes))
	}
	for _, sb := range res.Sandboxes {
		if sb.Status != protocol.StatusReady {
			tb.Fatalf("branch %s is %s", sb.Name, sb.Status)
		}
		if err := c.DeleteSandbox(ctx, sb.Name); err != nil {
			tb.Fatal(err)
		}
	}
	if err := c.DeleteSnapshot(ctx, res.SnapshotID); err != nil {
		tb.Fatal(err)
	}
	return took
}

// sandboxPSS is the PSS summed over sandbox id's host processes (see
// sandboxProcs), in bytes.
func sandboxPSS(tb testing.TB, id string) int64 {
	var n int64
	for _, p := range sandboxProcs(tb, []string{id})[id] {
		if v, err := procBytes(filepath.Join(p, "smaps_rollup"), "Pss"); err == nil {
			n += v
		}
	}
	if n == 0 {
		tb.Fatalf("no host process of sandbox %s", id)
	}
	return n
}

// bareIdle is a bare runsc container of the test image, detached and
// sleeping in a fresh netns: the baseline for exec and idle memory.
type bareIdle struct {
	runsc, root, id string
}

// startBareIdle starts one; it is deleted at the test's cleanup.
func startBareIdle(tb testing.TB, layer string) *bareIdle {
	_, runsc := binaries(tb)
	ns, _ := benchNetns(tb)
	bundle := bareBundle(tb, layer, ns, "sleep 100000")
	root := filepath.Join(tb.TempDir(), "runsc")
	id := make([]byte, 16)
	rand.Read(id)
	c := &bareIdle{runsc: runsc, root: root, id: hex.EncodeToString(id)}
	tb.Cleanup(func() {
		exec.Command(runsc, "--root", root, "delete", "--force", c.id).Run()
		unmountUnder(filepath.Dir(root))
	})
	// Its output goes to a file: the detached sandbox inherits it, and a
	// pipe (CombinedOutput) would wait for the sandbox to end.
	logf, err := os.Create(filepath.Join(tb.TempDir(), "runsc-run.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(runsc, "--root", root, "--platform=systrap", "--network=sandbox", "run", "--detach", "--bundle", bundle, c.id)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(logf.Name())
		tb.Fatalf("runsc run --detach: %v: %s", err, out)
	}
	c.exec(tb) // the first exec is not a round trip's
	return c
}

// exec times one `runsc exec` of `/bin/sh -c true`, the command the
// daemon's exec row runs.
func (c *bareIdle) exec(tb testing.TB) time.Duration {
	t0 := time.Now()
	out, err := exec.Command(c.runsc, "--root", c.root, "--platform=systrap", "exec", c.id, "/bin/sh", "-c", "true").CombinedOutput()
	took := time.Since(t0)
	if err != nil {
		tb.Fatalf("runsc exec: %v: %s", err, out)
	}
	return took
}

// pss is the container's host PSS in bytes.
func (c *bareIdle) pss(tb testing.TB) int64 { return sandboxPSS(tb, c.id) }

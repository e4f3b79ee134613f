package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// BenchmarkVsBaseline compares this build with a baseline build of
// cubicle (CUBICLE_BASELINE_BIN, e.g. the previous release) in the same
// run: rounds alternate between the two daemons (one at a time: they
// would share the host's nftables table), each round timing exec round
// trips (`true` over the WebSocket) and create→first output, and the
// result is each side's median and the ratio current/baseline. Skipped
// without CUBICLE_BASELINE_BIN (it is a measurement, not a check).
func BenchmarkVsBaseline(b *testing.B) {
	baseline := os.Getenv("CUBICLE_BASELINE_BIN")
	if baseline == "" {
		b.Skip("CUBICLE_BASELINE_BIN not set: nothing to compare with")
	}
	ref := testImage(b)
	const rounds, execs, creates = 4, 50, 5
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			bins := [2]string{baseline, ""} // [0] baseline, [1] this build
			var execD, createD [2][]time.Duration
			for b.Loop() {
				for r := range rounds {
					// Alternate which side goes first, so drift in the
					// host's load falls on both.
					for i := range 2 {
						side := (r + i) % 2
						e, c := measureRound(b, bins[side], rt, ref, execs, creates)
						execD[side] = append(execD[side], e...)
						createD[side] = append(createD[side], c...)
					}
				}
			}
			report := func(name string, ds [2][]time.Duration) {
				base, cur := median(ds[0]), median(ds[1])
				b.ReportMetric(float64(base.Microseconds())/1000, name+"-base-p50-ms")
				b.ReportMetric(float64(cur.Microseconds())/1000, name+"-p50-ms")
				b.ReportMetric(float64(cur)/float64(base), name+"-ratio")
			}
			report("exec", execD)
			report("create", createD)
			b.ReportMetric(0, "ns/op")
		})
	}
}

// measureRound starts a daemon running bin, times execs exec round trips
// on one sandbox and creates create→first-output runs, and stops it.
func measureRound(b *testing.B, bin, rt, ref string, execs, creates int) (execD, createD []time.Duration) {
	d := startDaemonBin(b, bin, rt, "")
	defer d.shutdown()
	ctx := context.Background()
	sn := readySnapshot(b, d.Client, "bench", ref)
	sb := newSandbox(b, d.Client, sn.ID, nil)
	for range execs {
		t0 := time.Now()
		code, err := d.Client.Exec(ctx, sb.Name, cubicle.ExecRequest{Command: "true", Shell: "/bin/sh", Stdout: io.Discard})
		execD = append(execD, time.Since(t0))
		if err != nil || code != 0 {
			b.Fatalf("true: %d %v", code, err)
		}
	}
	for range creates {
		t0 := time.Now()
		s, err := d.Client.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn.ID})
		if err != nil {
			b.Fatal(err)
		}
		first := &firstByte{}
		if _, err := d.Client.Exec(ctx, s.Name, cubicle.ExecRequest{Command: "echo hi", Shell: "/bin/sh", Stdout: first}); err != nil {
			b.Fatal(err)
		}
		createD = append(createD, first.at.Sub(t0))
		if err := d.Client.DeleteSandbox(ctx, s.Name); err != nil {
			b.Fatal(err)
		}
	}
	return execD, createD
}

// BenchmarkDownloadVsBaseline times a 100 MiB HTTP download (busybox
// wget to /dev/null) from the test internet in a sandbox without a
// proxy_config, this build against CUBICLE_BASELINE_BIN in the same run,
// rounds alternating: the cost of the egress proxy being always in the
// path for port 80. Reported: each side's median MiB/s and the ratio.
// Namespace runtime (busybox wget crashes under gVisor here).
func BenchmarkDownloadVsBaseline(b *testing.B) {
	baseline := os.Getenv("CUBICLE_BASELINE_BIN")
	if baseline == "" {
		b.Skip("CUBICLE_BASELINE_BIN not set: nothing to compare with")
	}
	const size, rounds, gets = 100 << 20, 3, 3
	in := newInternet(b)
	ref := testImage(b)
	cmd := fmt.Sprintf("wget -q -O /dev/null http://%s/bytes/%d", in.addr(0), size)
	bins := [2]string{baseline, ""}
	var mibs [2][]float64
	for b.Loop() {
		for r := range rounds {
			for i := range 2 {
				side := (r + i) % 2
				d := startDaemonBin(b, bins[side], "namespace", "")
				sn := readySnapshot(b, d.Client, "dl", ref)
				sb := newSandbox(b, d.Client, sn.ID, nil)
				for range gets {
					t0 := time.Now()
					mustRun(b, d.Client, sb.Name, cmd)
					mibs[side] = append(mibs[side], float64(size>>20)/time.Since(t0).Seconds())
				}
				d.shutdown()
			}
		}
	}
	base, cur := medianF(mibs[0]), medianF(mibs[1])
	b.ReportMetric(base, "base-MiB/s")
	b.ReportMetric(cur, "MiB/s")
	b.ReportMetric(cur/base, "ratio")
	b.ReportMetric(0, "ns/op")
}

func medianF(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

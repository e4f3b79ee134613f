package drivertest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Bench measures Start → first exec output (start_p50_ms, start_p95_ms)
// over b.N sandboxes, then the round trip of exec `true` on a running
// sandbox (exec_p50_ms, exec_p95_ms). Fixture setup (overlay, netns) is
// outside the timings; the agent's readiness poll is inside.
func Bench(b *testing.B, newDriver func(b *testing.B) runtime.Driver) {
	env := NewEnv(b)
	d := newDriver(b)
	ctx := context.Background()
	var starts []time.Duration
	var last *Sandbox
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s := env.Prepare(b, runtime.Limits{}, nil)
		b.StartTimer()
		t0 := time.Now()
		s.Launch(b, d)
		if out := s.MustExec(b, "echo ready"); out != "ready\n" {
			b.Fatalf("first exec: %q", out)
		}
		starts = append(starts, time.Since(t0))
		b.StopTimer()
		if last != nil {
			d.Stop(ctx, last.Spec.ID) // keep at most two sandboxes alive
		}
		last = s
		b.StartTimer()
	}
	var execs []time.Duration
	for i := 0; i < max(b.N, 50); i++ {
		t0 := time.Now()
		if _, err := last.Client.Exec(ctx, protocol.ExecFrame{Command: "true", Shell: "/bin/sh"}, nil, nil); err != nil {
			b.Fatal(err)
		}
		execs = append(execs, time.Since(t0))
	}
	report(b, "start", starts)
	report(b, "exec", execs)
}

func report(b *testing.B, name string, d []time.Duration) {
	slices.Sort(d)
	pct := func(p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.5), name+"_p50_ms")
	b.ReportMetric(pct(0.95), name+"_p95_ms")
}

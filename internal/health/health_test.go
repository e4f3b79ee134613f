package health

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestReport(t *testing.T) {
	ok := func(context.Context) error { return nil }
	broken := func(context.Context) error { return errors.New("read-only") }
	low := func(context.Context) error { return Warn(errors.New("2 GiB free")) }
	for _, tc := range []struct {
		name   string
		checks []Check
		want   string
	}{
		{"all pass", []Check{{"db", true, ok}, {"store", true, ok}}, StatusOK},
		{"critical fails", []Check{{"db", true, ok}, {"store", true, broken}}, StatusUnavailable},
		{"optional fails", []Check{{"db", true, ok}, {"proxy", false, broken}}, StatusDegraded},
		{"critical warns", []Check{{"store", true, low}, {"proxy", false, ok}}, StatusDegraded},
		{"nil probe skipped", []Check{{"db", true, ok}, {"none", true, nil}}, StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := New(tc.checks...).Run(context.Background())
			if rep.Status != tc.want {
				t.Fatalf("status %q, want %q (%+v)", rep.Status, tc.want, rep)
			}
			if rep.OK() != (tc.want == StatusOK) || (len(rep.Reasons()) == 0) != (tc.want == StatusOK) {
				t.Fatalf("OK %v reasons %q for %q", rep.OK(), rep.Reasons(), tc.want)
			}
		})
	}
	rep := New(Check{"store", true, broken}).Run(context.Background())
	if got := rep.Reasons(); len(got) != 1 || got[0] != "store: read-only" {
		t.Fatalf("reasons %q", got)
	}
}

func TestWedgedProbeIsReported(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	start := time.Now()
	rep := New(Check{"runtime", true, func(context.Context) error { <-release; return nil }}).Run(context.Background())
	if took := time.Since(start); took > probeTimeout+time.Second {
		t.Fatalf("Run waited %v for a wedged probe", took)
	}
	if rep.Status != StatusUnavailable || !strings.Contains(rep.Checks[0].Reason, "no answer") {
		t.Fatalf("wedged probe: %+v", rep)
	}
}

func TestRecentProbesAtMostOncePerAge(t *testing.T) {
	var calls int
	c := New(Check{"db", true, func(context.Context) error { calls++; return nil }})
	ctx := context.Background()
	for range 5 {
		c.Recent(ctx, time.Hour)
	}
	if calls != 1 {
		t.Fatalf("%d probes for 5 Recent calls within the age", calls)
	}
	c.Run(ctx)
	c.Recent(ctx, time.Hour)
	if calls != 2 {
		t.Fatalf("%d probes after Run then Recent, want 2", calls)
	}
	c.Recent(ctx, 0)
	if calls != 3 {
		t.Fatalf("%d probes after Recent with age 0, want 3", calls)
	}
}

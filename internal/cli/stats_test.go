package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func TestWriteStatsComputesCPUPercent(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := []protocol.SandboxStats{{ID: "a", Name: "box", SampledAt: t0, CPUSeconds: 1}}
	cur := []protocol.SandboxStats{
		{ID: "a", Name: "box", Status: "ready", SampledAt: t0.Add(2 * time.Second), CPUSeconds: 2, MemoryBytes: 64 << 20, MemoryLimitBytes: 1 << 30,
			DiskBytes: 1 << 20, NetRxBytes: 1500, NetTxBytes: 200},
		{ID: "b", Name: "new", Status: "stopped", SampledAt: t0.Add(2 * time.Second), DiskBytes: -1},
	}
	var buf bytes.Buffer
	if err := writeStats(&buf, prev, cur); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("table:\n%s", buf.String())
	}
	for _, want := range []string{"box", "50.00%", "64 MiB / 1.0 GiB", "1.0 MiB", "1.5 kB / 200 B"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row %q lacks %q", lines[1], want)
		}
	}
	if f := strings.Fields(lines[2]); f[2] != "--" {
		t.Errorf("a sandbox with one sample: %q, want CPU --", lines[2])
	}
}

package e2e

import (
	"cmp"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"golang.org/x/sys/unix"
)

// BenchmarkBranch measures, per runtime, on a sandbox holding ~200 MB of
// files: capturing it (the sandbox keeps running), and forking it into 1
// and 10 branches (time until every branch is ready, extra disk bytes by
// btrfs exclusive accounting and by the CoW filesystem's used-bytes delta,
// and extra memory as the branches' memory cgroup usage). Medians over
// b.N iterations are reported as custom metrics.
//
//	go test -run '^$' -bench Branch -benchtime 5x ./test/e2e/
func BenchmarkBranch(b *testing.B) {
	ref := testImage(b)
	for _, rt := range runtimes() {
		b.Run(rt, func(b *testing.B) {
			d := startDaemon(b, rt, "")
			c := d.Client
			sn := readySnapshot(b, c, "base", ref)
			p := newSandbox(b, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "big" })
			mustRun(b, c, p.Name, "mkdir -p /data && for i in 0 1 2 3 4 5 6 7 8 9; do dd if=/dev/urandom of=/data/blob$i bs=1M count=20 2>/dev/null; done && du -sm /data")
			b.Run("capture", func(b *testing.B) { benchCapture(b, c, p.Name) })
			for _, n := range []int{1, 10} {
				b.Run("fork"+strconv.Itoa(n), func(b *testing.B) { benchFork(b, d, p.Name, n) })
			}
		})
	}
}

func benchCapture(b *testing.B, c *cubicle.Client, name string) {
	ctx := context.Background()
	var times []float64
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		s, err := c.CaptureSnapshot(ctx, name, protocol.CaptureSnapshotRequest{Name: "cap"})
		times = append(times, ms(time.Since(t0)))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := c.DeleteSnapshot(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(median(times), "ms-median")
}

func benchFork(b *testing.B, d *daemon, name string, n int) {
	ctx := context.Background()
	c := d.Client
	var times, excl, fsDelta, mem []float64
	for i := 0; i < b.N; i++ {
		before := cowUsed(b, d)
		t0 := time.Now()
		res, err := c.Fork(ctx, name, protocol.ForkRequest{Count: n})
		times = append(times, ms(time.Since(t0)))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// Every branch sees the parent's 200 MB.
		if out := mustRun(b, c, res.Sandboxes[0].Name, "ls -l /data | awk '{s+=$5} END {print s}'"); strings.TrimSpace(out) != "209715200" {
			b.Fatalf("branch sees %q bytes in /data", out)
		}
		var bytes, rss int64
		sn, err := c.GetSnapshot(ctx, res.SnapshotID)
		if err != nil || sn.FSUsedBytes == nil {
			b.Fatalf("snapshot usage: %+v %v", sn, err)
		}
		bytes += *sn.FSUsedBytes
		for _, sb := range res.Sandboxes {
			got, err := c.GetSandbox(ctx, sb.Name)
			if err != nil || got.FSUsedBytes == nil {
				b.Fatalf("sandbox usage: %+v %v", got, err)
			}
			bytes += *got.FSUsedBytes
			rss += memUsage(sb.ID)
		}
		excl = append(excl, float64(bytes))
		fsDelta = append(fsDelta, float64(cowUsed(b, d)-before))
		mem = append(mem, float64(rss)/(1<<20))
		for _, sb := range res.Sandboxes {
			if err := c.DeleteSandbox(ctx, sb.Name); err != nil {
				b.Fatal(err)
			}
		}
		if err := c.DeleteSnapshot(ctx, res.SnapshotID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(median(times), "ms-median")
	b.ReportMetric(median(excl), "excl-bytes")
	b.ReportMetric(median(fsDelta), "fs-delta-bytes")
	b.ReportMetric(median(mem), "mem-MiB")
}

// cowUsed is the used bytes of the daemon's CoW filesystem, after a sync.
func cowUsed(b *testing.B, d *daemon) int64 {
	root := filepath.Join(d.dataDir, "cow")
	fd, err := unix.Open(root, unix.O_RDONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	unix.Syncfs(fd)
	unix.Close(fd)
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		b.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize
}

// memUsage is the memory cgroup usage of sandbox id (every process of it,
// the gVisor Sentry included), or 0 if unknown.
func memUsage(id string) int64 {
	rid := strings.ReplaceAll(id, "-", "")
	raw, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/cubicle", rid, "memory.usage_in_bytes"))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// median returns the middle of v (the upper one of an even count), or
// zero for none.
func median[T cmp.Ordered](v []T) T {
	if len(v) == 0 {
		var zero T
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// soakProfile is the soak's size: CUBICLE_SOAK (a duration) and
// CUBICLE_SOAK_SANDBOXES; the defaults are CI's short profile, `make
// soak` runs the long one (10 minutes, 50 sandboxes).
func soakProfile(t *testing.T) (time.Duration, int) {
	dur, n := 75*time.Second, 8
	if v := os.Getenv("CUBICLE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CUBICLE_SOAK=%q: %v", v, err)
		}
		dur = d
	}
	if v := os.Getenv("CUBICLE_SOAK_SANDBOXES"); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 {
			t.Fatalf("CUBICLE_SOAK_SANDBOXES=%q", v)
		}
		n = k
	}
	return dur, n
}

// soakSample is the daemon's footprint at one instant.
type soakSample struct {
	rss, fds, goroutines int64
}

func (e *egressEnv) soakSample(t *testing.T) soakSample {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", e.d.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	code, body := raw(t, e.d, testKey, "GET", "/metrics", nil)
	var g int64 = -1
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			g, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	if code != 200 || g < 0 {
		t.Fatalf("metrics: %d, go_goroutines %d", code, g)
	}
	return soakSample{rss: daemonMem(t, e.d, "VmRSS"), fds: int64(len(ents)), goroutines: g}
}

// TestSoak runs sandboxes × mixed work — exec streams with output, file
// uploads and downloads, egress requests to a test host in a network
// namespace, captures, forks, stops and starts — and samples the daemon's
// RSS, open fds and goroutines. After warm-up (the first third) they must
// show no growth trend (the last third's median within 25 % plus a small
// slack of the middle third's), no request may fail, and once everything
// is deleted nothing is left behind.
func TestSoak(t *testing.T) {
	dur, n := soakProfile(t)
	e := newEgressEnv(t, "gvisor")
	c := e.d.Client
	ctx := context.Background()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("soak-%d", i)
		e.sandbox(t, names[i], "")
	}
	payload := make([]byte, 256<<10)
	rand.Read(payload)

	var mu sync.Mutex
	var failures []string
	ops := map[string]int{}
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	count := func(op string) {
		mu.Lock()
		ops[op]++
		mu.Unlock()
	}
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for w, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				octx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				switch {
				case i%23 == 22:
					if err := c.StopSandbox(octx, name); err != nil {
						fail("stop %s: %v", name, err)
					} else if err := c.StartSandbox(octx, name); err != nil {
						fail("start %s: %v", name, err)
					}
					count("stop+start")
				case i%17 == 16:
					sn, err := c.CaptureSnapshot(octx, name, protocol.CaptureSnapshotRequest{Name: fmt.Sprintf("cap-%d-%d", w, i)})
					if err != nil {
						fail("capture %s: %v", name, err)
					} else if err := c.DeleteSnapshot(octx, sn.ID); err != nil {
						fail("delete capture of %s: %v", name, err)
					}
					count("capture")
				case i%29 == 28:
					fr, err := c.Fork(octx, name, protocol.ForkRequest{Count: 1})
					if err != nil {
						fail("fork %s: %v", name, err)
					} else {
						for _, b := range fr.Sandboxes {
							if err := c.DeleteSandbox(octx, b.Name); err != nil {
								fail("delete branch %s: %v", b.Name, err)
							}
						}
						if err := c.DeleteSnapshot(octx, fr.SnapshotID); err != nil {
							fail("delete fork snapshot of %s: %v", name, err)
						}
					}
					count("fork")
				case i%3 == 0:
					path := fmt.Sprintf("/tmp/blob-%d", i%4)
					if err := c.WriteFile(octx, name, path, bytes.NewReader(payload)); err != nil {
						fail("upload to %s: %v", name, err)
					} else if rc, err := c.ReadFile(octx, name, path); err != nil {
						fail("download from %s: %v", name, err)
					} else {
						got, err := io.ReadAll(rc)
						rc.Close()
						if err != nil || !bytes.Equal(got, payload) {
							fail("download from %s: %d bytes, %v", name, len(got), err)
						}
					}
					count("upload+download")
				case i%3 == 1:
					out, _, code := run(t, c, name, wgetName("allowed.test", e.in.addr(1)))
					if code != 0 || !strings.Contains(out, "host=allowed.test") {
						fail("egress from %s: exit %d %q", name, code, out)
					}
					count("egress")
				default:
					out, _, code := run(t, c, name, "seq 1 5000")
					if code != 0 || !strings.HasSuffix(out, "\n5000\n") {
						fail("exec in %s: exit %d, %d bytes", name, code, len(out))
					}
					count("exec")
				}
				cancel()
			}
		}()
	}
	var samples []soakSample
	for time.Now().Before(deadline) {
		samples = append(samples, e.soakSample(t))
		time.Sleep(2 * time.Second)
	}
	wg.Wait()
	t.Logf("soak: %d sandboxes for %v; operations %v", n, dur, ops)
	if len(failures) > 0 {
		t.Fatalf("%d failed operations, first: %q", len(failures), failures[:min(5, len(failures))])
	}
	third := len(samples) / 3
	if third < 3 {
		t.Fatalf("only %d samples", len(samples))
	}
	sorted := func(s []soakSample, f func(soakSample) int64) []int64 {
		v := make([]int64, len(s))
		for i, x := range s {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v
	}
	med := func(s []soakSample, f func(soakSample) int64) int64 { v := sorted(s, f); return v[len(v)/2] }
	for _, m := range []struct {
		name  string
		f     func(soakSample) int64
		slack int64
	}{
		{"RSS", func(s soakSample) int64 { return s.rss }, 16 << 20},
		{"open fds", func(s soakSample) int64 { return s.fds }, 32},
		{"goroutines", func(s soakSample) int64 { return s.goroutines }, 64},
	} {
		mid, last := med(samples[third:2*third], m.f), med(samples[2*third:], m.f)
		all := sorted(samples, m.f)
		t.Logf("%s: median after warm-up %d, at the end %d (max %d over %d samples)", m.name, mid, last, all[len(all)-1], len(all))
		if last > mid+mid/4+m.slack {
			t.Errorf("%s grows: median %d after warm-up, %d at the end", m.name, mid, last)
		}
	}

	for _, name := range names {
		if err := c.DeleteSandbox(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if l, err := c.ListSandboxes(ctx, cubicle.ListOptions{Limit: 500}); err != nil || len(l.Sandboxes) != 0 {
		t.Fatalf("sandboxes left: %v %v", l, err)
	}
	if left, err := c.Leftovers(ctx); err != nil || len(left) != 0 {
		t.Fatalf("leftovers after the soak: %v %v", left, err)
	}
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// execP50 is the median of k `true` round trips in sandbox name.
func execP50(t *testing.T, c *cubicle.Client, name string, k int) time.Duration {
	ds := make([]time.Duration, k)
	for i := range ds {
		t0 := time.Now()
		mustRun(t, c, name, "true")
		ds[i] = time.Since(t0)
	}
	slices.Sort(ds)
	return pct(ds, 50)
}

// sandboxProcs are the host processes of each sandbox: those with the
// sandbox's runtime id (its id without dashes) on their command lines —
// runsc's sandbox and gofer — and their descendants (gVisor's systrap
// stubs, which run the sandbox's code and share its memory): /proc/PID
// dirs by sandbox id.
func sandboxProcs(t testing.TB, ids []string) map[string][]string {
	rids := map[string]string{}
	for _, id := range ids {
		rids[strings.ReplaceAll(id, "-", "")] = id
	}
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		t.Fatal(err)
	}
	parent := map[string]string{} // /proc/PID → /proc/PPID
	owner := map[string]string{}  // /proc/PID → sandbox id
	for _, p := range procs {
		f, err := statFields(p)
		if err != nil {
			continue // exited
		}
		parent[p] = "/proc/" + f[1]
		cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		for _, arg := range strings.Split(string(cmd), "\x00") {
			if id, ok := rids[arg]; ok {
				owner[p] = id
				break
			}
		}
	}
	out := map[string][]string{}
	for _, p := range procs {
		for q := p; q != "" && q != "/proc/0"; q = parent[q] {
			if id, ok := owner[q]; ok {
				out[id] = append(out[id], p)
				break
			}
		}
	}
	return out
}

// statFields are the fields of /proc/PID/stat after the command (which
// may hold spaces): state, ppid, … (utime and stime are the 12th and
// 13th).
func statFields(proc string) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(proc, "stat"))
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return nil, fmt.Errorf("%s/stat: %d fields", proc, len(f))
	}
	return f, nil
}

// cpuTicks is the user and system time of procs, in clock ticks.
func cpuTicks(procs map[string][]string) int64 {
	var n int64
	for _, ps := range procs {
		for _, p := range ps {
			f, err := statFields(p)
			if err != nil {
				continue
			}
			u, _ := strconv.ParseInt(f[11], 10, 64)
			s, _ := strconv.ParseInt(f[12], 10, 64)
			n += u + s
		}
	}
	return n
}

// TestDensity creates CUBICLE_DENSITY idle gVisor sandboxes (default 20;
// `make soak` runs 500), a few at a time, and reports the host memory
// they take (PSS summed over each sandbox's processes, the host's
// MemAvailable before and after), their CPU while idle, and the exec
// round trip on one sandbox
// with all of them idle against the same sandbox alone on the host: the
// daemon stays responsive (p50 within 2×) and every create succeeds.
func TestDensity(t *testing.T) {
	n := envInt(t, "CUBICLE_DENSITY", 20)
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	c := d.Client
	sn := readySnapshot(t, c, "density", ref)
	first := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "density-0" })
	mustRun(t, c, first.Name, "true") // warm the agent's connection
	idle := execP50(t, c, first.Name, 30)
	availBefore, err := procBytes("/proc/meminfo", "MemAvailable")
	if err != nil {
		t.Fatal(err)
	}

	ids := make([]string, n)
	ids[0] = first.ID
	errs := make([]error, n)
	work := make(chan int)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				sb, err := c.CreateSandbox(ctx, protocol.CreateSandboxRequest{SnapshotID: sn.ID, Name: fmt.Sprintf("density-%d", i)})
				cancel()
				if err == nil && sb.Status != protocol.StatusReady {
					err = fmt.Errorf("status %s (%s)", sb.Status, sb.StatusMessage)
				}
				if err != nil {
					errs[i] = fmt.Errorf("create density-%d: %w", i, err)
					continue
				}
				ids[i] = sb.ID
			}
		}()
	}
	for i := 1; i < n; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	created := time.Since(t0)
	defer deleteAll(t, c, n)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(5 * time.Second) // boots settle: what remains is idle cost
	availAfter, err := procBytes("/proc/meminfo", "MemAvailable")
	if err != nil {
		t.Fatal(err)
	}
	procs := sandboxProcs(t, ids)
	const idleWindow = 10 * time.Second
	ticks := cpuTicks(procs)
	time.Sleep(idleWindow)
	// USER_HZ is 100 on Linux: a tick is 10 ms.
	idleCPU := float64(cpuTicks(procs)-ticks) * 10 * float64(time.Millisecond) / float64(idleWindow) / float64(n)
	var per []int64
	var total int64
	nprocs := 0
	for _, id := range ids {
		var v int64
		for _, p := range procs[id] {
			if kb, err := procBytes(filepath.Join(p, "smaps_rollup"), "Pss"); err == nil {
				v += kb
				nprocs++
			}
		}
		per = append(per, v)
		total += v
	}
	slices.Sort(per)
	busy := execP50(t, c, first.Name, 30)
	const mib = 1 << 20
	t.Logf("%d idle gVisor sandboxes created in %v; PSS per sandbox p50 %.1f MiB, max %.1f MiB, mean %.1f MiB (%d processes, %.0f MiB in all); host MemAvailable %.0f → %.0f MiB (%.1f MiB per sandbox); daemon RSS %.0f MiB; idle CPU %.2f %% of a core per sandbox; exec p50 %v idle host, %v with %d idle sandboxes (%.2f×)",
		n, created.Round(time.Millisecond), float64(per[n/2])/mib, float64(per[n-1])/mib, float64(total)/float64(n)/mib, nprocs, float64(total)/mib,
		float64(availBefore)/mib, float64(availAfter)/mib, float64(availBefore-availAfter)/float64(n-1)/mib,
		float64(daemonMem(t, d, "VmRSS"))/mib, 100*idleCPU, idle.Round(10*time.Microsecond), busy.Round(10*time.Microsecond), n, float64(busy)/float64(idle))
	logBootPhases(t, d, 0)
	logBootPhases(t, d, n-n/10) // the last tenth: boots beside the most
	if per[0] == 0 {
		t.Errorf("a sandbox with no process found (PSS 0)")
	}
	if busy > 2*idle {
		t.Errorf("exec p50 %v with %d idle sandboxes, more than 2× the idle host's %v", busy, n, idle)
	}
}

// deleteAll deletes sandboxes density-0 … density-(n-1), a few at a
// time (the daemon's own cleanup deletes one by one within a minute).
func deleteAll(t *testing.T, c *cubicle.Client, n int) {
	work := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				if err := c.DeleteSandbox(ctx, "density-"+strconv.Itoa(i)); err != nil {
					t.Errorf("delete density-%d: %v", i, err)
				}
				cancel()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
}

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestMicroVM drives the microvm runtime (QEMU microvm, the project's own
// guest kernel; TCG on this host) end to end: the official npm client's
// smoke over its WebSocket exec, then through the Go SDK — the guest
// kernel's own uname, files kept across stop/start, a capture and a fork
// whose branch has the parent's files on its own VM. Figures for the note
// are logged (create→first output, exec round trip).
func TestMicroVM(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "microvm", "")
	c := d.Client
	ctx := context.Background()

	resp, err := http.Get(d.Endpoint + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	var h protocol.Health
	json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if h.Runtime != "microvm" || (h.Accelerator != "kvm" && h.Accelerator != "tcg") {
		t.Fatalf("healthz runtime %q accelerator %q", h.Runtime, h.Accelerator)
	}
	t.Logf("microvm accelerator: %s", h.Accelerator)

	t.Run("official client smoke", func(t *testing.T) {
		runSmoke(t, npmDirVersion(t, "0.12", true), d.Endpoint, ref)
	})

	sn := readySnapshot(t, c, "vm", ref)
	t0 := time.Now()
	p := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "vm-parent"; r.MemBytes = int64p(256 << 20) })
	first := mustRun(t, c, p.Name, "echo first")
	t.Logf("create→first output: %v", time.Since(t0).Round(time.Millisecond))
	if first != "first\n" {
		t.Fatalf("first output %q", first)
	}

	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	release := strings.TrimSpace(mustRun(t, c, p.Name, "uname -r"))
	if release == "" || release == strings.TrimSpace(string(host)) || strings.Contains(release, "gvisor") {
		t.Fatalf("uname -r inside %q (host %q): want the guest kernel's", release, host)
	}
	t.Logf("guest kernel %s, host %s", release, strings.TrimSpace(string(host)))

	var rtts []time.Duration
	for range 20 {
		t1 := time.Now()
		mustRun(t, c, p.Name, "true")
		rtts = append(rtts, time.Since(t1))
	}
	slices.Sort(rtts)
	t.Logf("exec round trip p50 %v (20 runs)", rtts[len(rtts)/2].Round(100*time.Microsecond))

	// The isolation battery runs on this runtime too (TestIsolation); the
	// cloud metadata address is one more thing a guest must not reach:
	// raw TCP to it is dropped, HTTP ends at the egress proxy's 403.
	if out, _, code := run(t, c, p.Name, "nc -w 2 169.254.169.254 8080 </dev/null && echo OPEN; timeout 10 wget -q -O- http://169.254.169.254/latest/meta-data/ 2>&1"); code == 0 || strings.Contains(out, "OPEN") || !strings.Contains(out, "403") {
		t.Fatalf("metadata address from the guest: %q (exit %d)", out, code)
	}
	pss, cpu := qemuCost(t, d.dataDir, 5*time.Second)
	t.Logf("idle VM (256 MiB limit): QEMU PSS %d MiB, CPU %.2f %% of a core over 5 s", pss>>20, cpu*100)

	mustRun(t, c, p.Name, "mkdir -p /work && echo kept > /work/f && sync")
	if err := c.StopSandbox(ctx, p.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.StartSandbox(ctx, p.Name); err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, c, p.Name, "cat /work/f"); got != "kept\n" {
		t.Fatalf("after stop/start: %q", got)
	}

	// A running VM is paused (QMP stop) for the capture and keeps going.
	mustRun(t, c, p.Name, "echo captured > /work/c")
	capt, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "vm-cap"})
	if err != nil || capt.Status != protocol.SnapshotReady {
		t.Fatalf("capture: %+v %v", capt, err)
	}
	if got := mustRun(t, c, p.Name, "echo still; cat /work/c"); got != "still\ncaptured\n" {
		t.Fatalf("parent after capture: %q", got)
	}
	fork, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 1, Names: []string{"vm-branch"}})
	if err != nil || len(fork.Sandboxes) != 1 {
		t.Fatalf("fork: %+v %v", fork, err)
	}
	if got := mustRun(t, c, "vm-branch", "cat /work/f /work/c; hostname; uname -r"); got != "kept\ncaptured\nvm-branch\n"+release+"\n" {
		t.Fatalf("branch sees %q", got)
	}
	mustRun(t, c, "vm-branch", "echo mine > /work/f")
	if got := mustRun(t, c, p.Name, "cat /work/f"); got != "kept\n" {
		t.Fatalf("parent sees the branch's write: %q", got)
	}
	_, err = c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "vm-mem", IncludeMemory: true})
	wantStatus(t, err, http.StatusUnprocessableEntity)
}

// qemuCost returns the PSS of the one QEMU serving dataDir's sandboxes
// and the share of a core it used over window.
func qemuCost(t *testing.T, dataDir string, window time.Duration) (pss int64, cpu float64) {
	t.Helper()
	pid := ""
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(string(b), "qemu-system") && strings.Contains(string(b), dataDir) {
			pid = e.Name()
		}
	}
	if pid == "" {
		t.Fatal("no QEMU process for the daemon's sandboxes")
	}
	ticks := func() int64 {
		b, _ := os.ReadFile("/proc/" + pid + "/stat")
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		return u + s
	}
	before := ticks()
	time.Sleep(window)
	cpu = float64(ticks()-before) / 100 / window.Seconds()
	b, _ := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Pss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			pss = kb << 10
		}
	}
	return pss, cpu
}

package microvm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/cavaliergopher/cpio"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/microvm/guest"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// TestInitrd: the initramfs holds the agent as an executable /init and the
// guest config, and nothing else.
func TestInitrd(t *testing.T) {
	dir := t.TempDir()
	agent := filepath.Join(dir, "agent")
	if err := os.WriteFile(agent, []byte("\x7fELF agent bytes"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := guest.Config{Hostname: "h", Token: "secret-token", Tasks: 64, Mounts: []guest.Mount{{Target: "/data", ReadOnly: true}}}
	path := filepath.Join(dir, "initrd")
	if err := writeInitrd(path, agent, &cfg); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("initrd mode %v, %v: want 0600 (it holds the token)", fi.Mode(), err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := cpio.NewReader(f)
	seen := map[string][]byte{}
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		seen[h.Name] = b
		if h.Name == "init" && h.Mode.Perm() != 0o755 {
			t.Errorf("/init mode %v", h.Mode)
		}
	}
	if string(seen["init"]) != "\x7fELF agent bytes" || len(seen) != 2 {
		t.Fatalf("entries %v", seen)
	}
	var got guest.Config
	if err := json.Unmarshal(seen["cubicle.json"], &got); err != nil || got.Token != cfg.Token || len(got.Mounts) != 1 || !got.Mounts[0].ReadOnly {
		t.Fatalf("config %+v, %v", got, err)
	}
	if err := writeInitrd(path, agent, nil); err == nil {
		t.Fatal("writeInitrd over an existing file succeeded")
	}
}

func TestSizing(t *testing.T) {
	if got := vcpus(runtime.Limits{MilliCPUs: 1500}); got != 2 {
		t.Errorf("vcpus(1500m) = %d, want 2", got)
	}
	if got := vcpus(runtime.Limits{MilliCPUs: 1000}); got != 1 {
		t.Errorf("vcpus(1000m) = %d, want 1", got)
	}
	if got := guestBytes(runtime.Limits{MemBytes: 64 << 20}); got != 64<<20+guestOverheadBytes {
		t.Errorf("guestBytes(64 MiB) = %d", got)
	}
	if got := guestBytes(runtime.Limits{}); got != defaultGuestBytes {
		t.Errorf("guestBytes(unlimited) = %d", got)
	}
	n := guestNet{IP: net.IPv4(10, 244, 0, 2), Mask: net.CIDRMask(30, 32), Gateway: net.IPv4(10, 244, 0, 1)}
	if got, want := n.kernelArg("box"), "ip=10.244.0.2::10.244.0.1:255.255.255.252:box:eth0:off"; got != want {
		t.Errorf("kernelArg = %q, want %q", got, want)
	}
}

func TestExitCause(t *testing.T) {
	d := &Driver{cfg: Config{StateDir: t.TempDir()}}
	id := "0123456789abcdef0123456789abcdef"
	if err := os.MkdirAll(filepath.Join(d.dir(id), consoleDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if got := d.ExitCause(id); got != "" {
		t.Fatalf("no console: %q", got)
	}
	log := "booting\n[    1.0] Out of memory: Killed process 42 (hog)\nKernel panic - not syncing: Attempted to kill init!\n"
	os.WriteFile(filepath.Join(d.dir(id), consoleFile), []byte(log), 0o600)
	if got, want := d.ExitCause(id), "guest: Kernel panic - not syncing: Attempted to kill init!"; got != want {
		t.Fatalf("ExitCause = %q, want %q", got, want)
	}
}

// TestProbeAnswerKept: a probe's answer is reused for the same host boot,
// QEMU and kernel, and not once the kernel changes.
func TestProbeAnswerKept(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, []byte("k1"), 0o644)
	cfg := Config{QEMU: "/nonexistent/qemu", Kernel: kernel, StateDir: dir}
	os.WriteFile(filepath.Join(dir, "accel-probe"), []byte(probeKey(cfg)+" kvm\n"), 0o600)
	if got := probeAccel(context.Background(), cfg); got != AccelKVM {
		t.Fatalf("kept answer not used: %q", got)
	}
	os.WriteFile(kernel, []byte("another kernel"), 0o644)
	// No agent: the probe cannot boot, so a fresh answer is tcg.
	if got := probeAccel(context.Background(), cfg); got != AccelTCG {
		t.Fatalf("answer for another kernel reused: %q", got)
	}
	if got := probeAccel(context.Background(), cfg); got != AccelTCG {
		t.Fatalf("fresh answer not kept: %q", got)
	}
}

// TestSlots: concurrent allocations get distinct slots, the lowest free
// ones; a released slot is taken again; slots live in the state dir, so a
// restarted daemon sees them taken; releasing frees the owner's only.
func TestSlots(t *testing.T) {
	dir := t.TempDir()
	const n = 32
	got := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = allocSlot(dir, fmt.Sprintf("owner%d", i))
		}()
	}
	wg.Wait()
	seen := map[int]bool{}
	for i, s := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if seen[s] || s < 0 || s >= n {
			t.Fatalf("slots %v: want each of 0..%d once", got, n-1)
		}
		seen[s] = true
	}
	if err := releaseSlots(dir, "owner5"); err != nil {
		t.Fatal(err)
	}
	if err := releaseSlots(dir, "nobody"); err != nil {
		t.Fatal(err)
	}
	// Nothing in memory: what a restarted daemon calls sees the same.
	if s, err := allocSlot(dir, "again"); err != nil || s != got[5] {
		t.Fatalf("after releasing slot %d: allocSlot = %d, %v", got[5], s, err)
	}
	if s, err := allocSlot(dir, "next"); err != nil || s != n {
		t.Fatalf("allocSlot with 0..%d taken = %d, %v", n-1, s, err)
	}
	b, err := os.ReadFile(filepath.Join(dir, slotsDir, strconv.Itoa(got[7])))
	if err != nil || string(b) != "owner7" {
		t.Fatalf("slot %d holds %q, %v: want its owner", got[7], b, err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, slotsDir))
	if len(ents) != n+1 {
		t.Fatalf("%d files in the slots dir, want %d (no temporary files left)", len(ents), n+1)
	}
	if ids, err := (&Driver{cfg: Config{StateDir: dir}}).List(context.Background()); err != nil || len(ids) != 0 {
		t.Fatalf("List = %v, %v: the slots dir is no sandbox", ids, err)
	}
	if a, b := slotHostID(0), slotHostID(maxSlots-1)+userns.IDMapSize-1; a <= userns.HostIDBase+userns.IDMapSize || b >= 1<<31 {
		t.Fatalf("slot ranges %d..%d: want above the namespace runtime's and below 2^31", a, b)
	}
}

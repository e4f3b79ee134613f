package microvm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/drivertest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// testKernel is $CUBICLE_GUEST_KERNEL, else the repo's bin/vmlinux (make
// guest-kernel); without one the tests skip (under CI: fail) saying so.
func testKernel(tb testing.TB) string {
	tb.Helper()
	testenv.RequireRoot(tb, "QEMU in a network namespace")
	testenv.RequireTool(tb, "qemu-system-x86_64")
	if p := os.Getenv("CUBICLE_GUEST_KERNEL"); p != "" {
		return p
	}
	dir, _ := os.Getwd()
	for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "bin", KernelFile)
			if _, err := os.Stat(p); err != nil {
				testenv.Skip(tb, "no guest kernel at %s: build it with make guest-kernel", p)
			}
			return p
		}
	}
	testenv.Skip(tb, "no guest kernel: build it with make guest-kernel")
	return ""
}

var stateDirs sync.Map // state dirs with a removal registered

// testAccel probes the accelerator once per test binary (a probe on a
// host without usable KVM waits out KVMProbeTimeout).
func testAccel(kernel, agent string) string {
	accelOnce.Do(func() {
		accel = AccelTCG
		if dir, err := os.MkdirTemp("", "cubicle-vmprobe-"); err == nil {
			defer os.RemoveAll(dir)
			accel = ProbeAccel(context.Background(), Config{QEMU: "qemu-system-x86_64", Kernel: kernel, StateDir: dir, Agent: agent})
		}
	})
	return accel
}

var (
	accelOnce sync.Once
	accel     string
)

// newTestDriver returns a driver whose state dir is derived from t.Name(),
// so a second call in the same test sees the first one's sandboxes.
func newTestDriver(tb testing.TB, agent string) *Driver {
	tb.Helper()
	dir := filepath.Join(os.TempDir(), "cubicle-vmtest-"+regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(tb.Name(), "_"))
	kernel := testKernel(tb)
	d, err := New(context.Background(), Config{Kernel: kernel, StateDir: dir, Agent: agent, Accel: testAccel(kernel, agent)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("microvm accelerator: %s", d.Accel())
	// Once per dir, and so after every Stop of the test's sandboxes
	// (cleanups run last-in first-out): a state dir removed first would
	// leave its VM running.
	if _, again := stateDirs.LoadOrStore(dir, true); !again {
		tb.Cleanup(func() { os.RemoveAll(dir); stateDirs.Delete(dir) })
	}
	return d
}

func TestDriverSuite(t *testing.T) {
	env := drivertest.NewEnv(t)
	drivertest.Run(t, func(t *testing.T) runtime.Driver { return newTestDriver(t, env.Agent) })
}

// TestOwnKernel: the sandbox runs on the guest kernel, not the host's, so
// what root inside asks of a kernel (AF_ALG, io_uring, modules) reaches
// only the guest's; the token is not on its command line; PID 1's memory
// stays unreadable.
func TestOwnKernel(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t, env.Agent)
	s := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20}, nil)
	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	out := s.MustExec(t, "uname -r; cat /proc/cmdline")
	release := strings.SplitN(out, "\n", 2)[0]
	if release == strings.TrimSpace(string(host)) || release == "" {
		t.Fatalf("uname -r inside = %q, host %q: want the guest kernel's own", release, host)
	}
	if strings.Contains(out, s.Spec.Token) {
		t.Fatal("the agent token is on the guest kernel's command line")
	}
	// The guest kernel has no module support at all: nothing inside can
	// add code to it, let alone to the host's.
	if out, _, code := s.Exec(t, "test -e /proc/modules && echo modules; echo x > /m.ko; busybox insmod /m.ko"); code == 0 || strings.Contains(out, "modules") {
		t.Errorf("module support inside the guest: %q (exit %d)", out, code)
	}
	if out, _, code := s.Exec(t, "cat /proc/1/maps"); code == 0 {
		t.Errorf("root inside reads PID 1's memory map:\n%.200s", out)
	}
}

// TestStopFindsAnUnrecordedVM: a VM whose state file is gone (a crash
// between launch and writing it) is still found and killed by Stop.
func TestStopFindsAnUnrecordedVM(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t, env.Agent)
	s := env.Start(t, d, runtime.Limits{}, nil)
	ctx := context.Background()
	pid, err := d.PID(ctx, s.Spec.ID)
	if err != nil || pid == 0 {
		t.Fatalf("PID = %d, %v", pid, err)
	}
	if err := os.Remove(filepath.Join(d.dir(s.Spec.ID), stateFile)); err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(ctx, s.Spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Fatalf("QEMU %d still runs after Stop", pid)
	}
}

package microvm

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/drivertest"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// TestMain lets the test binary double as QEMU's jail, as the daemon's
// binary does with `cubicle vmjail`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == JailArg {
		Jail()
	}
	os.Exit(m.Run())
}

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

// TestQEMUIsNoOneOnTheHost: QEMU — what code that broke out of the guest
// kernel would run as — is no one on the host: a uid and gid of the
// sandbox range with no supplementary group, only 9p's capabilities and
// those in a user namespace of its own (none in the host's), other mount,
// pid and network namespaces, a root holding its jail only and a /proc
// showing its own process alone. Yet what the guest's root writes lands in the
// upper dir owned by host root, and a guest's chown by that uid.
func TestQEMUIsNoOneOnTheHost(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t, env.Agent)
	s := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20}, nil)
	pid, err := d.PID(context.Background(), s.Spec.ID)
	if err != nil || pid == 0 {
		t.Fatalf("PID = %d, %v", pid, err)
	}
	proc := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(proc + "/status")
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			status[k] = strings.TrimSpace(v)
		}
	}
	for _, k := range []string{"Uid", "Gid"} {
		for _, id := range strings.Fields(status[k]) {
			if id != strconv.Itoa(userns.HostIDBase) {
				t.Errorf("QEMU's %s: %q, want %d (real, effective, saved, fs)", k, status[k], userns.HostIDBase)
				break
			}
		}
	}
	if status["Groups"] != "" {
		t.Errorf("QEMU's supplementary groups: %q, want none", status["Groups"])
	}
	var want uint64
	for _, c := range jailCaps {
		want |= 1 << c
	}
	for _, k := range []string{"CapEff", "CapPrm", "CapBnd"} {
		if got, err := strconv.ParseUint(status[k], 16, 64); err != nil || got != want {
			t.Errorf("QEMU's %s: %s, want %016x (9p's only)", k, status[k], want)
		}
	}
	if status["CapAmb"] != "0000000000000000" || status["NoNewPrivs"] != "1" || status["Seccomp"] != "2" {
		t.Errorf("QEMU's CapAmb %s, NoNewPrivs %s, Seccomp %s: want none, 1, 2 (filter)", status["CapAmb"], status["NoNewPrivs"], status["Seccomp"])
	}
	// Capabilities act in their holder's user namespace and those below:
	// in a namespace of its own, QEMU has none over the host.
	for _, ns := range []string{"user", "mnt", "pid", "net"} {
		own, err1 := os.Readlink(proc + "/ns/" + ns)
		host, err2 := os.Readlink("/proc/self/ns/" + ns)
		if err1 != nil || err2 != nil || own == host {
			t.Errorf("QEMU's %s namespace %q, the host's %q (%v, %v): want its own", ns, own, host, err1, err2)
		}
	}
	// Its root holds its jail only: no host dir beyond the system ones,
	// no state dir, no host file in /etc but the linker's cache.
	ents, err := os.ReadDir(proc + "/root")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"dev": true, "etc": true, "proc": true, strings.TrimPrefix(jailExports, "/"): true}
	for _, p := range systemDirs {
		allowed[strings.TrimPrefix(p, "/")] = true
	}
	for _, e := range ents {
		if !allowed[e.Name()] {
			t.Errorf("QEMU's root shows /%s", e.Name())
		}
	}
	for dir, want := range map[string]string{"etc": "ld.so.cache", "dev": "null urandom", "export": "root"} {
		ents, err := os.ReadDir(proc + "/root/" + dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if err != nil || strings.Join(names, " ") != want {
			t.Errorf("QEMU's /%s holds %q (%v), want %q", dir, names, err, want)
		}
	}
	ents, err = os.ReadDir(proc + "/root/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch _, err := strconv.Atoi(e.Name()); {
		case err == nil && e.Name() != "1":
			t.Errorf("QEMU's /proc shows process %s besides itself", e.Name())
		case err != nil && e.Name() != "self" && e.Name() != "thread-self":
			t.Errorf("QEMU's /proc shows the kernel's /proc/%s", e.Name())
		}
	}

	s.MustExec(t, "echo x > /by-root && mkdir /dir-by-root && touch /by-user && chown 1234:2345 /by-user && chmod 4755 /by-user && ls -ln /by-user")
	for p, want := range map[string][2]uint32{"by-root": {0, 0}, "dir-by-root": {0, 0}, "by-user": {1234, 2345}} {
		fi, err := os.Lstat(filepath.Join(s.RootFS.Upper, p))
		if err != nil {
			t.Fatalf("upper dir: %v", err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s in the upper dir owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, want[0], want[1])
		}
		if p == "by-user" && fi.Mode()&os.ModeSetuid == 0 {
			t.Errorf("%s lost its setuid bit (mode %v)", p, fi.Mode())
		}
	}
}

package microvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/drivertest"
	"github.com/cubicle-dev/cubicle/internal/runtime/microvm/guest"
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
			accel = ProbeAccel(context.Background(), Config{Kernel: kernel, StateDir: dir, Agent: agent})
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
// kernel would run as — is no one on the host: the uid and gid of its id
// slot's range with no supplementary group, only 9p's capabilities and
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
	status, err := procStatus(pid)
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := d.readState(s.Spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if uid := qemuUID(t, status); uid != slotHostID(st.Slot) {
		t.Errorf("QEMU's uid %d, want %d (slot %d's)", uid, slotHostID(st.Slot), st.Slot)
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

// procStatus is /proc/<pid>/status as a map.
func procStatus(pid int) (map[string]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil, err
	}
	status := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			status[k] = strings.TrimSpace(v)
		}
	}
	return status, nil
}

// qemuUID is the one uid of a QEMU's status: its real, effective, saved
// and fs uids and gids must all be it, an unprivileged id of a slot range.
func qemuUID(t *testing.T, status map[string]string) int {
	t.Helper()
	ids := append(strings.Fields(status["Uid"]), strings.Fields(status["Gid"])...)
	if len(ids) != 8 {
		t.Fatalf("QEMU's Uid %q, Gid %q", status["Uid"], status["Gid"])
	}
	for _, id := range ids[1:] {
		if id != ids[0] {
			t.Fatalf("QEMU's Uid %q, Gid %q: want one id (real, effective, saved, fs)", status["Uid"], status["Gid"])
		}
	}
	uid, err := strconv.Atoi(ids[0])
	if err != nil || uid < slotIDBase || (uid-slotIDBase)%userns.IDMapSize != 0 {
		t.Fatalf("QEMU's uid %s: want root of a slot range (%d + n*%d)", ids[0], slotIDBase, userns.IDMapSize)
	}
	return uid
}

// TestQEMUsAreDifferentUsers: two VMs' QEMUs are different host users; a
// stopped VM's slot is taken again; a driver restarted on the state dir
// (the daemon after kill -9) finds the running VM with its slot kept and
// gives a new VM another.
func TestQEMUsAreDifferentUsers(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t, env.Agent)
	ctx := context.Background()
	uidOf := func(d *Driver, id string) int {
		t.Helper()
		pid, err := d.PID(ctx, id)
		if err != nil || pid == 0 {
			t.Fatalf("PID of %s = %d, %v", id, pid, err)
		}
		status, err := procStatus(pid)
		if err != nil {
			t.Fatal(err)
		}
		return qemuUID(t, status)
	}
	a := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20}, nil)
	b := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20}, nil)
	uidA, uidB := uidOf(d, a.Spec.ID), uidOf(d, b.Spec.ID)
	if uidA == uidB {
		t.Fatalf("both QEMUs run as host uid %d", uidA)
	}
	if err := d.Stop(ctx, a.Spec.ID); err != nil {
		t.Fatal(err)
	}
	c := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20}, nil)
	if uid := uidOf(d, c.Spec.ID); uid != uidA {
		t.Errorf("QEMU started after Stop runs as %d, want the stopped one's %d (its slot freed)", uid, uidA)
	}

	restarted := newTestDriver(t, env.Agent)
	if uid := uidOf(restarted, b.Spec.ID); uid != uidB {
		t.Errorf("after a restart, QEMU of %s runs as %d, want %d", b.Spec.ID, uid, uidB)
	}
	st, ok, err := restarted.readState(b.Spec.ID)
	if err != nil || !ok || slotHostID(st.Slot) != uidB {
		t.Errorf("after a restart, state of %s: slot %d (%v, %v), want uid %d's", b.Spec.ID, st.Slot, ok, err, uidB)
	}
	e := env.Start(t, restarted, runtime.Limits{MemBytes: 256 << 20}, nil)
	if uid := uidOf(restarted, e.Spec.ID); uid == uidB || uid == uidA {
		t.Errorf("QEMU started after a restart runs as %d, a running one's uid", uid)
	}
}

// TestProbeIsJailed: the accelerator probe's QEMU runs as a sandbox's
// does — an unprivileged uid of a slot of its own, in its own user, mount
// and pid namespaces — still boots the guest (here under TCG, which needs
// no /dev/kvm), and gives its slot back.
func TestProbeIsJailed(t *testing.T) {
	env := drivertest.NewEnv(t)
	cfg, err := Config{Kernel: testKernel(t), StateDir: t.TempDir(), Agent: env.Agent}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	booted := make(chan bool, 1)
	go func() { booted <- bootsUnder(context.Background(), cfg, AccelTCG, 2*time.Minute) }()
	mark := []byte("\x00guest=" + filepath.Join(cfg.StateDir, "probe-"))
	var seen map[string]string
	var seenPID int
	for seen == nil {
		select {
		case ok := <-booted:
			t.Fatalf("probe done (booted %v) before its QEMU was seen", ok)
		case <-time.After(10 * time.Millisecond):
		}
		for _, pid := range qemusWith(cfg.QEMU, mark) {
			if status, err := procStatus(pid); err == nil {
				seen, seenPID = status, pid
				for _, ns := range []string{"user", "mnt", "pid"} {
					own, err1 := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
					host, err2 := os.Readlink("/proc/self/ns/" + ns)
					if err1 != nil || err2 != nil || own == host {
						t.Errorf("probe QEMU's %s namespace %q, the host's %q (%v, %v): want its own", ns, own, host, err1, err2)
					}
				}
				break
			}
		}
	}
	if uid := qemuUID(t, seen); seen["Groups"] != "" {
		t.Errorf("probe QEMU %d (uid %d): supplementary groups %q, want none", seenPID, uid, seen["Groups"])
	}
	if !<-booted {
		t.Fatal("the jailed probe did not boot the guest under TCG")
	}
	if ents, err := os.ReadDir(filepath.Join(cfg.StateDir, slotsDir)); err != nil || len(ents) != 0 {
		t.Fatalf("slots after the probe: %v, %v: want it freed", ents, err)
	}
}

// TestAgentOnSerialPort: the agent's API is reached over the VM's
// virtio-serial port alone. No socket listens on the agent port inside,
// root inside cannot open the port (the agent holds it, and a port takes
// one opener), and a restarted driver (a restarted daemon) reaches the
// running VM's agent through the same port.
func TestAgentOnSerialPort(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t, env.Agent)
	s := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20}, nil)
	tcp := s.MustExec(t, "cat /proc/net/tcp") // the guest kernel has no IPv6
	port := fmt.Sprintf(":%04X", agent.Port)
	for _, line := range strings.Split(tcp, "\n") {
		if f := strings.Fields(line); len(f) > 3 && strings.HasSuffix(f[1], port) && f[3] == "0A" {
			t.Errorf("a socket listens on the agent port inside: %s", line)
		}
	}
	out, _, code := s.Exec(t, `set -e; for p in /sys/class/virtio-ports/*; do n=$(cat $p/dev); mknod /dev/p c ${n%:*} ${n#*:}; echo $(cat $p/name); echo x > /dev/p && echo OPENED; done`)
	if !strings.Contains(out, guest.AgentPortName) || strings.Contains(out, "OPENED") || code == 0 {
		t.Errorf("root inside opening the agent port: %q (exit %d), want it busy", out, code)
	}

	d.closePort(s.Spec.ID) // the old daemon is gone
	restarted := newTestDriver(t, env.Agent)
	c := s.AgentClient(restarted, s.Spec.Token)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Health(ctx); err != nil {
		b, _ := os.ReadFile(filepath.Join(d.dir(s.Spec.ID), consoleFile))
		t.Fatalf("the restarted driver's agent client: %v\n%s", err, b)
	}
	s.Client = c
	if got := strings.TrimSpace(s.MustExec(t, "echo again")); got != "again" {
		t.Fatalf("exec after a restart: %q", got)
	}
}

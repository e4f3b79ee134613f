package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/drivertest"
)

// childStartEnv makes the test binary act as a short-lived "daemon": it
// starts the sandbox described by the variable's JSON value and exits.
const childStartEnv = "CUBICLE_GVISOR_TEST_CHILD_START"

// childStart is the payload of childStartEnv.
type childStart struct {
	Runsc, StateDir string
	Spec            runtime.Spec
}

func init() {
	// Runs before TestMain in the re-executed child only.
	v := os.Getenv(childStartEnv)
	if v == "" {
		return
	}
	var c childStart
	if err := json.Unmarshal([]byte(v), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	d, err := New(c.Runsc, c.StateDir)
	if err == nil {
		err = d.Start(context.Background(), c.Spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// TestDriverSuite runs the shared conformance suite with the real agent.
func TestDriverSuite(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) runtime.Driver { return suiteDriver(t) })
}

func BenchmarkDriver(b *testing.B) {
	drivertest.Bench(b, func(b *testing.B) runtime.Driver { return suiteDriver(b) })
}

// suiteDriver returns a Driver whose state dir is derived from tb.Name(), so
// that a second call in the same test acts as a restarted daemon.
func suiteDriver(tb testing.TB) *Driver {
	e := requireEnv(tb)
	dir := filepath.Join(e.tmp, "suite-"+regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(tb.Name(), "_"))
	d, err := New(e.runsc, dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

func TestStartStop(t *testing.T) {
	ctx := context.Background()
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{MilliCPUs: 500, MemBytes: 512 << 20, PidsMax: 256})

	if got := s.get(t, "/hostname", nil); got != s.spec.Hostname {
		t.Errorf("hostname = %q, want %q", got, s.spec.Hostname)
	}
	s.get(t, "/write", url.Values{"path": {"/marker"}, "data": {"from-inside"}})
	if b, err := os.ReadFile(filepath.Join(s.upper, "marker")); err != nil || string(b) != "from-inside" {
		t.Errorf("upper/marker = %q, %v; want the sandbox's write in the host upper dir", b, err)
	}
	// Root can chown (CAP_CHOWN), and the result reaches the host.
	s.sh(t, "touch /owned && chown 1000:1000 /owned")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(s.upper, "owned"), &st); err != nil || st.Uid != 1000 {
		t.Errorf("upper/owned: uid %d, %v; want 1000", st.Uid, err)
	}
	if got := s.sh(t, "cat /etc/resolv.conf"); !strings.Contains(got, "nameserver ") || strings.Contains(got, "127.0.0.53") {
		t.Errorf("resolv.conf = %q", got)
	}
	if got := s.sh(t, "grep "+s.spec.Hostname+" /etc/hosts; id -u; echo '10.9.9.9 extra' >> /etc/hosts && echo edited"); !strings.Contains(got, s.spec.Hostname) || !strings.Contains(got, "\n0\nedited") {
		t.Errorf("hosts/id/edit check = %q", got)
	}
	// /etc/hosts is the sandbox's own file, in its upper dir (its quota).
	if b, err := os.ReadFile(filepath.Join(s.upper, "etc/hosts")); err != nil || !strings.Contains(string(b), "10.9.9.9 extra") {
		t.Errorf("upper/etc/hosts = %q, %v; want root's edit", b, err)
	}
	if got := s.sh(t, "echo x > /.cubicle/cubicle || echo ro"); !strings.Contains(got, "ro") {
		t.Errorf("agent binary writable inside: %q", got)
	}

	if ok, err := d.Running(ctx, s.id); err != nil || !ok {
		t.Fatalf("Running = %v, %v; want true", ok, err)
	}
	// PID answers from runsc's pid file what runsc state says.
	var state containerState
	if out, err := d.run(ctx, "state", s.id); err != nil || json.Unmarshal(out, &state) != nil {
		t.Fatalf("runsc state: %s %v", out, err)
	}
	if pid, ok := d.pidFromFile(s.id); !ok || pid != state.Pid {
		t.Fatalf("pid from the pid file %d (%v), runsc state %d", pid, ok, state.Pid)
	}
	// A new Driver on the same state dir (a restarted daemon) re-adopts.
	d2, err := New(d.runsc, d.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d2.Running(ctx, s.id); err != nil || !ok {
		t.Fatalf("new driver: Running = %v, %v; want true", ok, err)
	}
	if err := d2.Stop(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	assertGone(t, d, s.id)
	if _, err := s.tryGet("/hostname", nil, time.Second); err == nil {
		t.Error("agent still answers after Stop")
	}
	if err := d.Stop(ctx, s.id); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// assertGone checks that nothing of sandbox id remains: runsc reports it
// not running, no host process mentions it, its state dir is gone.
func assertGone(t *testing.T, d *Driver, id string) {
	t.Helper()
	if ok, err := d.Running(context.Background(), id); err != nil || ok {
		t.Errorf("Running = %v, %v; want false", ok, err)
	}
	if p := processesMentioning(id); len(p) > 0 {
		t.Errorf("host processes left for %s: %v", id, p)
	}
	if _, err := os.Stat(d.bundleDir(id)); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids/cubicle/" + id); !os.IsNotExist(err) {
		t.Errorf("cgroup left: %v", err)
	}
}

// TestSurvivesDaemonExit starts a sandbox from a child process that then
// exits and has its whole process group SIGKILLed, as a service manager
// would do to a daemon; the sandbox must keep running.
func TestSurvivesDaemonExit(t *testing.T) {
	e := requireEnv(t)
	d := newDriver(t)
	merged, _ := rootFS(t)
	ns, ip := netNS(t)
	s := &sandbox{id: newID(t), ip: ip}
	s.spec = runtime.Spec{ID: s.id, RootFS: merged, AgentBinary: e.standin,
		Env: []string{"STANDIN_PORT=" + standinPort}, Hostname: "survivor", NetNS: ns}
	payload, _ := json.Marshal(childStart{Runsc: d.runsc, StateDir: d.stateDir, Spec: s.spec})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childStartEnv+"="+string(payload))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t.Cleanup(func() { d.Stop(context.Background(), s.id) })
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child Start: %v: %s", err, out)
	}
	unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
	time.Sleep(200 * time.Millisecond)
	waitReady(t, s)
	if got := s.get(t, "/hostname", nil); got != "survivor" {
		t.Errorf("hostname = %q", got)
	}
	if ok, err := d.Running(context.Background(), s.id); err != nil || !ok {
		t.Errorf("Running = %v, %v; want true", ok, err)
	}
}

// TestEscape checks that the sandbox sees gVisor's kernel, not the host's
// files or processes.
func TestEscape(t *testing.T) {
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{})

	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	hostRelease := unix.ByteSliceToString(uts.Release[:])
	if got := strings.TrimSpace(s.sh(t, "uname -r")); got == hostRelease || got == "" {
		t.Errorf("uname -r inside = %q, host %q: want gVisor's emulated release", got, hostRelease)
	}
	if got := s.sh(t, "cat /proc/version"); strings.Contains(got, hostRelease) {
		t.Errorf("/proc/version shows the host kernel: %q", got)
	}
	if got := s.sh(t, "dmesg"); !strings.Contains(got, "gVisor") {
		t.Errorf("dmesg does not show gVisor's boot log: %q", got)
	}

	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := s.sh(t, "cat "+secret+" 2>&1; ls /home /var 2>&1; cat /etc/shadow 2>&1"); strings.Contains(got, "s3cret") {
		t.Errorf("host file visible inside: %q", got)
	}

	// Host processes: the sandbox's /proc holds only its own few tasks,
	// none of them this test binary.
	procs := strings.Fields(s.sh(t, "cd /proc && ls -d [0-9]*"))
	if len(procs) == 0 || len(procs) > 10 {
		t.Errorf("sandbox sees %d processes: %v", len(procs), procs)
	}
	self := filepath.Base(os.Args[0])
	if got := s.sh(t, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"); strings.Contains(got, self) || strings.Contains(got, "runsc") {
		t.Errorf("host processes visible: %q", got)
	}
	if got := s.sh(t, "cat /proc/1/cmdline | tr '\\0' ' '"); !strings.HasPrefix(got, runtime.AgentMountPath+" agent") {
		t.Errorf("PID 1 = %q, want the agent", got)
	}
}

// TestMemoryLimit documents the host backstop behind MemBytes. The stand-in
// agent runs no OOM guard (the real agent does; see drivertest's
// MemoryHogIsKilled), so this is what happens when the guard cannot act in
// time, e.g. one system call that commits more than hostMemLimit's
// headroom: a process within the limit runs; one far past it makes the
// host memory cgroup OOM-kill the Sentry, so that whole sandbox dies and is
// reported not running, while other sandboxes carry on. MemTotal inside is
// still the sandbox's own limit, not the host cgroup's.
func TestMemoryLimit(t *testing.T) {
	ctx := context.Background()
	d := newDriver(t)
	other := startSandbox(t, d, runtime.Limits{})
	s := startSandbox(t, d, runtime.Limits{MemBytes: 256 << 20})

	if got := s.sh(t, "grep MemTotal /proc/meminfo"); !strings.Contains(got, strconv.Itoa(256<<10)+" kB") {
		t.Errorf("MemTotal inside = %q, want the limit", got)
	}
	if got := s.sh(t, "timeout 5 "+runtime.AgentMountPath+" hog 128"); !strings.Contains(got, "held 128") {
		t.Errorf("128 MiB under a 256 MiB limit: %q", got)
	}
	// The response never comes: the Sentry (and its netstack) is killed.
	s.tryGet("/sh", url.Values{"c": {runtime.AgentMountPath + " hog 1024"}}, 3*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, err := d.Running(ctx, s.id)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sandbox over its memory limit still running after 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := other.sh(t, "echo alive"); got != "alive\n" {
		t.Errorf("other sandbox: %q", got)
	}
	if err := d.Stop(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	assertGone(t, d, s.id)
}

// TestForkBomb checks that PidsMax stops a fork bomb inside the sandbox
// (RLIMIT_NPROC in the Sentry) without killing the sandbox, and that Stop
// then removes every process.
func TestForkBomb(t *testing.T) {
	ctx := context.Background()
	d := newDriver(t)
	other := startSandbox(t, d, runtime.Limits{})
	s := startSandbox(t, d, runtime.Limits{PidsMax: 128})
	s.sh(t, "(b(){ b|b& }; b) >/dev/null 2>&1 &")
	time.Sleep(3 * time.Second)
	if ok, err := d.Running(ctx, s.id); err != nil || !ok {
		t.Fatalf("Running = %v, %v; want true", ok, err)
	}
	if got, err := s.tryGet("/hostname", nil, 5*time.Second); err != nil || got != s.spec.Hostname {
		t.Errorf("agent during fork bomb: %q, %v", got, err)
	}
	cur, _ := os.ReadFile("/sys/fs/cgroup/pids/cubicle/" + s.id + "/pids.current")
	t.Logf("host pids.current during the bomb: %s (host limit %d)", strings.TrimSpace(string(cur)), hostPidsLimit(128))
	if got := other.sh(t, "echo alive"); got != "alive\n" {
		t.Errorf("other sandbox: %q", got)
	}
	if err := d.Stop(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	assertGone(t, d, s.id)
}

// TestStartFailure checks that a failed Start returns runsc's reason and
// leaves nothing behind.
func TestStartFailure(t *testing.T) {
	ctx := context.Background()
	d := newDriver(t)
	merged, _ := rootFS(t)
	ns, _ := netNS(t)
	bogus := filepath.Join(t.TempDir(), "not-a-binary")
	if err := os.WriteFile(bogus, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := newID(t)
	err := d.Start(ctx, runtime.Spec{ID: id, RootFS: merged, AgentBinary: bogus, Hostname: "x", NetNS: ns})
	if err == nil {
		d.Stop(ctx, id)
		t.Fatal("Start with a non-executable agent succeeded")
	}
	t.Logf("Start error: %v", err)
	if !strings.Contains(err.Error(), "runsc run") || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("error lacks runsc's reason: %v", err)
	}
	assertGone(t, d, id)
	out, _ := exec.Command(d.runsc, "--root", d.runscRoot(), "list", "-q").Output()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("runsc still lists: %q", out)
	}
}

func TestStartConflict(t *testing.T) {
	d := newDriver(t)
	s := startSandbox(t, d, runtime.Limits{})
	if err := d.Start(context.Background(), s.spec); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Start = %v, want ErrConflict", err)
	}
	if ok, _ := d.Running(context.Background(), s.id); !ok {
		t.Error("the running sandbox was disturbed")
	}
}

func TestInvalid(t *testing.T) {
	ctx := context.Background()
	d := newDriver(t)
	if err := d.Stop(ctx, newID(t)); err != nil {
		t.Errorf("Stop of an unknown id: %v", err)
	}
	if ok, err := d.Running(ctx, newID(t)); ok || err != nil {
		t.Errorf("Running of an unknown id = %v, %v", ok, err)
	}
	if err := d.Stop(ctx, "abc"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Stop(abc) = %v, want ErrInvalid", err)
	}
	err := d.Start(ctx, runtime.Spec{ID: newID(t), RootFS: "/nonexistent", AgentBinary: "/bin/true", NetNS: "/proc/self/ns/net"})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Start with a missing rootfs = %v, want ErrInvalid", err)
	}
}

func TestFindRunsc(t *testing.T) {
	if _, err := FindRunsc("/nonexistent/runsc"); err == nil {
		t.Error("FindRunsc of a missing flag value succeeded")
	}
	if got, err := FindRunsc("/bin/sh"); err != nil || got != "/bin/sh" {
		t.Errorf("FindRunsc(/bin/sh) = %q, %v", got, err)
	}
}

// TestRestartOnSameNetNS checks that Stop gives the netns back its address
// and default route (runsc's netstack takes them over), so a sandbox can be
// started again on the same endpoint; with WithDebugLog, runsc's debug logs
// appear.
func TestRestartOnSameNetNS(t *testing.T) {
	ctx := context.Background()
	debug := t.TempDir()
	d := newDriver(t, WithDebugLog(debug))
	s := startSandbox(t, d, runtime.Limits{})
	ns := filepath.Base(s.spec.NetNS)
	if out, _ := exec.Command("ip", "-n", ns, "-4", "addr", "show", "eth0").CombinedOutput(); strings.Contains(string(out), s.ip) {
		t.Logf("runsc left the address on the host side while running: %s", out)
	}
	if err := d.Stop(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("ip", "-n", ns, "-4", "addr", "show", "eth0").CombinedOutput()
	routes, _ := exec.Command("ip", "-n", ns, "route").CombinedOutput()
	if !strings.Contains(string(out), s.ip+"/30") || !strings.Contains(string(routes), "default via") {
		t.Errorf("netns not restored after Stop: %s %s", out, routes)
	}
	if ents, _ := os.ReadDir(filepath.Join(debug, s.id)); len(ents) == 0 {
		t.Error("WithDebugLog wrote no logs")
	}
	// make build's runsc has its seccomp filters precompiled
	// (tools/runsc/build.sh): the Sentry and the gofer load them rather
	// than compile them at each start.
	for _, cmd := range []string{"boot", "gofer"} {
		logs, _ := filepath.Glob(filepath.Join(debug, s.id, "*."+cmd+".txt"))
		var found bool
		for _, l := range logs {
			b, _ := os.ReadFile(l)
			found = found || strings.Contains(string(b), "Loaded precompiled seccomp instructions")
		}
		if !found {
			t.Errorf("runsc %s compiled its seccomp filters at start (logs %v): bin/runsc was not built by tools/runsc/build.sh", cmd, logs)
		}
	}
	s.id = newID(t)
	s.spec.ID = s.id
	if err := d.Start(ctx, s.spec); err != nil {
		t.Fatal(err)
	}
	defer d.Stop(ctx, s.id)
	waitReady(t, s)
}

// TestConcurrent starts and stops several sandboxes at once on one Driver.
func TestConcurrent(t *testing.T) {
	d := newDriver(t)
	for i := range 4 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			s := startSandbox(t, d, runtime.Limits{MemBytes: 256 << 20, PidsMax: 256})
			if got := s.get(t, "/hostname", nil); got != s.spec.Hostname {
				t.Errorf("hostname = %q", got)
			}
		})
	}
}

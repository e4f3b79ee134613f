package namespace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/drivertest"
)

// TestMain lets the test binary double as the sandbox init, as the daemon's
// binary does with `cubicle nsinit`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == InitArg {
		Init()
	}
	if len(os.Args) > 2 && os.Args[1] == probeArg {
		runProbe(os.Args[2])
	}
	os.Exit(m.Run())
}

// newTestDriver returns a driver whose state dir is derived from t.Name(),
// so a second call in the same test sees the first one's sandboxes.
func newTestDriver(tb testing.TB) *Driver {
	tb.Helper()
	dir := filepath.Join(os.TempDir(), "cubicle-nstest-"+regexp.MustCompile(`[^a-zA-Z0-9]+`).ReplaceAllString(tb.Name(), "_"))
	d, err := New(dir, WithCgroupRoot("/sys/fs/cgroup", "cubicle-test"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		d.Close()
		os.RemoveAll(dir)
	})
	return d
}

func TestDriverSuite(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) runtime.Driver { return newTestDriver(t) })
}

func BenchmarkDriver(b *testing.B) {
	drivertest.Bench(b, func(b *testing.B) runtime.Driver { return newTestDriver(b) })
}

// TestEscape checks the namespace driver's own hardening: what root inside
// may not do, and how it looks from the host.
func TestEscape(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t)
	s := env.Start(t, d, runtime.Limits{MemBytes: 256 << 20, PidsMax: 512, MilliCPUs: 1500}, nil)

	denied := map[string]string{
		"mount tmpfs":        "mount -t tmpfs none /mnt",
		"mount proc":         "mkdir -p /p && mount -t proc proc /p",
		"load module":        "insmod /nonexistent.ko",
		"unshare userns":     "unshare -U true",
		"unshare mount ns":   "unshare -m true",
		"nsenter host":       "nsenter -t 1 -m true",
		"chroot escape":      "mkdir -p /x && chroot /x /bin/true",
		"set time":           "date -s 2000-01-01 >/dev/null; test $(date +%Y) = 2000",
		"raw disk":           "ls /dev/vda /dev/sda",
		"kernel log":         "dmesg",
		"write sysfs":        "echo 1 > /sys/kernel/mm/ksm/run",
		"write proc sysctl":  "echo 1 > /proc/sys/kernel/sysrq",
		"sethostname again":  "hostname evil",
		"swapoff":            "swapoff -a && grep -q . /proc/swaps",
		"host cgroup fs":     "ls /sys/fs/cgroup/memory",
		"reboot":             "reboot -f",
		"mknod block device": "mknod /tmp/sda b 8 0 && head -c1 /tmp/sda",
	}
	for name, cmd := range denied {
		if out, errOut, code := s.Exec(t, cmd); code == 0 {
			t.Errorf("%s: %q succeeded inside (stdout %q stderr %q)", name, cmd, out, errOut)
		}
	}

	status := s.MustExec(t, "cat /proc/1/status")
	want := map[string]string{
		"CapEff":     fmt.Sprintf("%016x", keptMask()),
		"CapBnd":     fmt.Sprintf("%016x", keptMask()),
		"NoNewPrivs": "1",
		"Seccomp":    "2",
		"Uid":        "0\t0\t0\t0",
	}
	for k, v := range want {
		if got := field(status, k); got != v {
			t.Errorf("/proc/1/status inside %s = %q, want %q", k, got, v)
		}
	}
	// Only single-file binds (the device nodes) come from the host's disk;
	// no host directory, netns or cgroup tree is mounted, and neither the
	// rootfs layers nor the agent binary reveal their host paths.
	mounts := s.MustExec(t, "cat /proc/self/mountinfo")
	t.Logf("mountinfo inside:\n%s", mounts)
	for _, hostPath := range []string{env.Base, filepath.Dir(env.Agent), filepath.Dir(s.RootFS.Upper), filepath.Dir(s.RootFS.Merged)} {
		if strings.Contains(mounts, hostPath) {
			t.Errorf("host path %s visible in mountinfo inside", hostPath)
		}
	}
	if agent := regexp.MustCompile(`(?m)^\S+ \S+ \S+ (\S+) /\.cubicle/cubicle .* - tmpfs `).FindStringSubmatch(mounts); agent == nil || agent[1] != "/cubicle" {
		t.Errorf("agent binary not mounted from the driver's tmpfs copy: %q", agent)
	}
	if strings.Contains(mounts, "/var/run/netns") ||
		strings.Contains(mounts, " cgroup ") || regexp.MustCompile(`(?m)^\S+ \S+ \S+ / \S+ .* - ext4 `).MatchString(mounts) {
		t.Errorf("host mounts visible inside:\n%s", mounts)
	}
	if out := s.MustExec(t, "cat /proc/self/cgroup"); strings.Contains(out, "cubicle") {
		t.Errorf("cgroup namespace leaks host paths: %q", out)
	}

	// From the host: PID 1 runs as the unprivileged mapped uid.
	st, err := d.readState(s.Spec.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.PID))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := field(string(b), "Uid"), "1000000\t1000000\t1000000\t1000000"; got != want {
		t.Errorf("host view of PID 1 Uid = %q, want %q", got, want)
	}
	// The limits landed in the cgroups; pids.max is the task bound
	// (runtime.Limits.Tasks): PidsMax 512 lowered to one per MiB of memory.
	for file, want := range map[string]string{
		"memory/cubicle-test/%s/memory.limit_in_bytes": "268435456",
		"pids/cubicle-test/%s/pids.max":                "256",
		"cpu/cubicle-test/%s/cpu.cfs_quota_us":         "150000",
	} {
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", fmt.Sprintf(file, s.Spec.ID)))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %s", file, b, err, want)
		}
	}
	if err := d.Stop(context.Background(), s.Spec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/pids/cubicle-test", s.Spec.ID)); !os.IsNotExist(err) {
		t.Errorf("cgroup left after Stop: %v", err)
	}
}

// TestStartFailureLeavesNothing starts on a bogus netns and checks that no
// state or cgroup remains.
func TestStartFailureLeavesNothing(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t)
	s := env.Prepare(t, runtime.Limits{PidsMax: 10}, func(sp *runtime.Spec) { sp.NetNS = "/nonexistent" })
	if err := d.Start(context.Background(), s.Spec); err == nil {
		t.Fatal("Start with a missing netns succeeded")
	}
	s = env.Prepare(t, runtime.Limits{PidsMax: 10}, func(sp *runtime.Spec) { sp.AgentBinary = "/etc/hostname" })
	err := d.Start(context.Background(), s.Spec)
	if err == nil {
		t.Fatal("Start with a non-executable agent succeeded")
	}
	t.Logf("expected error: %v", err)
	if _, err := os.Stat(d.dir(s.Spec.ID)); !os.IsNotExist(err) {
		t.Errorf("state dir left after failed Start: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/pids/cubicle-test", s.Spec.ID)); !os.IsNotExist(err) {
		t.Errorf("cgroup left after failed Start: %v", err)
	}
}

func keptMask() uint64 {
	var m uint64
	for _, c := range keptCaps {
		m |= 1 << c
	}
	return m
}

func field(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestStartRefusesDocker: Docker inside is refused up front (it would
// need the host's own CAP_SYS_ADMIN), leaving no state.
func TestStartRefusesDocker(t *testing.T) {
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	id := "0123456789abcdef0123456789abcdef"
	err = d.Start(context.Background(), runtime.Spec{ID: id, RootFS: "/", AgentBinary: "/bin/true", NetNS: "/proc/self/ns/net", Docker: true})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("start with docker: %v, want ErrInvalid", err)
	}
	if _, err := os.Stat(d.dir(id)); !os.IsNotExist(err) {
		t.Errorf("state dir left after the refusal: %v", err)
	}
	if _, ok := any(d).(runtime.DockerHost); ok {
		t.Error("the namespace driver claims to host Docker")
	}
}

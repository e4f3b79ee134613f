package namespace

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/drivertest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// probeArg makes the test binary, copied into a sandbox, run one of probes
// instead of the tests: attacks that need raw syscalls no shell tool makes.
const probeArg = "nsprobe"

// probes are the test binary's in-sandbox modes. Each writes its findings to
// stdout; the tests judge them on the host.
var probes = map[string]func() error{
	// syscalls tries every refused call of syscallAttacks (and the allowed
	// baseline) and prints "name<TAB>errno number, or 0".
	"syscalls": func() error {
		for _, a := range syscallAttacks() {
			fmt.Printf("%s\t%d\n", a.name, errnoOf(a.call()))
		}
		fmt.Println("done") // proves the probe was not killed on the way
		return nil
	},
	// inotify-hold creates inotify instances until refused, prints how many
	// it got and why it stopped, then holds them until killed.
	"inotify-hold": func() error {
		n, err := 0, error(nil)
		for ; n < 1<<16; n++ {
			if _, err = unix.InotifyInit1(unix.IN_CLOEXEC); err != nil {
				break
			}
		}
		fmt.Printf("%d %d\n", n, errnoOf(err))
		os.Stdout.Close()
		for {
			time.Sleep(time.Hour)
		}
	},
}

func runProbe(name string) {
	p, ok := probes[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown probe %q\n", name)
		os.Exit(2)
	}
	if err := p(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// syscallAttack is one call a sandbox tries; want lists the acceptable
// results (0 for success).
type syscallAttack struct {
	name string
	call func() error
	want []unix.Errno
}

func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	return unix.EINVAL
}

func rawErr(_, _ uintptr, e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func socketAttack(name string, family, typ, proto int, want ...unix.Errno) syscallAttack {
	return syscallAttack{name: name, want: want, call: func() error {
		fd, err := unix.Socket(family, typ, proto)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}}
}

// hostImage returns a rootfs for a sandbox that looks like a distribution
// image: an overlay over the host's own root filesystem (its python3, dpkg,
// apt, compilers and libraries) with a tmpfs upper layer, and the test
// binary copied in as /probe.
func hostImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	scratch := filepath.Join(dir, "scratch")
	merged := filepath.Join(dir, "merged")
	for _, d := range []string{scratch, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The upper layer may not live on the lower filesystem.
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "size=512m"); err != nil {
		t.Fatalf("mount scratch tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(scratch, unix.MNT_DETACH) })
	upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := copyExecutable(self, filepath.Join(upper, "probe")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, fmt.Sprintf("lowerdir=/,upperdir=%s,workdir=%s", upper, work)); err != nil {
		t.Fatalf("mount host image overlay: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	return merged
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// startHostImage starts a sandbox on a fresh hostImage.
func startHostImage(t *testing.T, env *drivertest.Env, d *Driver) *drivertest.Sandbox {
	t.Helper()
	root := hostImage(t)
	return env.Start(t, d, runtime.Limits{MemBytes: 1 << 30, PidsMax: 512}, func(sp *runtime.Spec) { sp.RootFS = root })
}

// TestSeccompRefusesAttackSurface performs each refused call from inside a
// sandbox and checks it fails with the documented errno instead of running
// or killing the caller, while the calls every distribution needs succeed.
func TestSeccompRefusesAttackSurface(t *testing.T) {
	if len(syscallAttacks()) == 0 {
		t.Skip("no syscall attack table for this architecture")
	}
	env := drivertest.NewEnv(t)
	s := startHostImage(t, env, newTestDriver(t))
	out := s.MustExec(t, "/probe "+probeArg+" syscalls")
	got := map[string]unix.Errno{}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || lines[len(lines)-1] != "done" {
		t.Fatalf("probe did not finish (killed?):\n%s", out)
	}
	for _, l := range lines[:len(lines)-1] {
		var name string
		var e int
		if _, err := fmt.Sscanf(l, "%s\t%d", &name, &e); err != nil {
			t.Fatalf("probe line %q: %v", l, err)
		}
		got[name] = unix.Errno(e)
	}
	var names []string
	for _, a := range syscallAttacks() {
		names = append(names, a.name)
		e, ok := got[a.name]
		if !ok {
			t.Errorf("%s: no result", a.name)
			continue
		}
		accepted := false
		for _, w := range a.want {
			accepted = accepted || e == w
		}
		if !accepted {
			t.Errorf("%s inside: errno %d (%v), want one of %v", a.name, e, e, a.want)
		}
	}
	sort.Strings(names)
	t.Logf("checked: %s", strings.Join(names, " "))

	// Route netlink reads work and writes are refused by the kernel: the
	// netns belongs to the host's user namespace, where the sandbox has no
	// CAP_NET_ADMIN.
	if out := s.MustExec(t, "ip -o link show lo"); !strings.Contains(out, "lo:") {
		t.Errorf("ip link show inside: %q", out)
	}
	if _, errOut, code := s.Exec(t, "ip link set lo down"); code == 0 || !strings.Contains(errOut, "not permitted") {
		t.Errorf("ip link set lo down inside: exit %d, stderr %q; want EPERM", code, errOut)
	}
}

// distroScript is what a user does first in a fresh sandbox: compile, run
// Python, build a package whose maintainer script adds a system user, and
// install and remove it with apt-get and dpkg.
const distroScript = `set -e
id -u
printf '#include <stdio.h>\nint main(void){puts("compiled");return 0;}\n' > /tmp/h.c
gcc -o /tmp/h /tmp/h.c && /tmp/h
python3 -c 'import subprocess, socket, multiprocessing as m, os; print("python", subprocess.check_output(["echo", "ok"]).decode().strip(), m.Pool(2).map(abs, [-1, -2]))'
mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/share/cbt-probe
echo hi > /tmp/pkg/usr/share/cbt-probe/hi
printf 'Package: cbt-probe\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.com>\nDescription: probe\n' > /tmp/pkg/DEBIAN/control
printf '#!/bin/sh\nset -e\nuseradd --system --no-create-home cbtsvc\n' > /tmp/pkg/DEBIAN/postinst
chmod 0755 /tmp/pkg/DEBIAN/postinst
dpkg-deb --root-owner-group --build /tmp/pkg /tmp/cbt-probe.deb >/dev/null
apt-get install -y /tmp/cbt-probe.deb >/tmp/apt.log 2>&1 || { cat /tmp/apt.log; exit 1; }
dpkg -s cbt-probe | grep -q 'Status: install ok installed'
id cbtsvc >/dev/null && stat -c %U /usr/share/cbt-probe/hi
dpkg -r cbt-probe >/dev/null && test ! -e /usr/share/cbt-probe/hi
echo distro-ok
`

// TestDistroToolsWork runs a root shell's usual work on a distribution image
// under the allow list: a compiler, python3, dpkg and apt-get.
func TestDistroToolsWork(t *testing.T) {
	for _, tool := range []string{"/usr/bin/gcc", "/usr/bin/python3", "/usr/bin/dpkg", "/usr/bin/apt-get", "/usr/sbin/useradd"} {
		if _, err := os.Stat(tool); err != nil {
			testenv.Skip(t, "the host image lacks %s: %v", tool, err)
		}
	}
	env := drivertest.NewEnv(t)
	s := startHostImage(t, env, newTestDriver(t))
	out, errOut, code := s.Exec(t, distroScript)
	if code != 0 || !strings.HasSuffix(out, "distro-ok\n") {
		t.Fatalf("distribution tools inside: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"0\n", "compiled\n", "python ok [1, 2]\n", "root\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// nsOwner returns the host uid owning the user namespace of pid
// (NS_GET_OWNER_UID).
func nsOwner(t *testing.T, pid int) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var uid uint32
	const nsGetOwnerUID = 0xb704 // _IO(0xb7, 0x4)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		t.Fatalf("NS_GET_OWNER_UID: %v", e)
	}
	return int(uid)
}

// holdInotify starts inotify-hold in s and returns how many instances it
// got and the errno that stopped it.
func holdInotify(t *testing.T, s *drivertest.Sandbox) (int, unix.Errno) {
	t.Helper()
	s.MustExec(t, "/probe "+probeArg+" inotify-hold >/tmp/inotify 2>&1 &")
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var n, e int
		if _, err := fmt.Sscanf(s.MustExec(t, "cat /tmp/inotify"), "%d %d", &n, &e); err == nil {
			return n, unix.Errno(e)
		}
	}
	t.Fatal("inotify-hold reported nothing in 10 s")
	return 0, 0
}

// TestInotifyBudgetIsPerSandbox has one sandbox take every inotify instance
// it can and checks that the host's root and a neighbour sandbox still get
// theirs: each sandbox's user namespace has its own owner, which the kernel
// charges instead of host root.
func TestInotifyBudgetIsPerSandbox(t *testing.T) {
	env := drivertest.NewEnv(t)
	d := newTestDriver(t)
	a, b := startHostImage(t, env, d), startHostImage(t, env, d)
	owners := map[int]bool{}
	for _, s := range []*drivertest.Sandbox{a, b} {
		pid, err := d.PID(context.Background(), s.Spec.ID)
		if err != nil || pid == 0 {
			t.Fatalf("PID: %d, %v", pid, err)
		}
		owner := nsOwner(t, pid)
		// Fatal before the exhaustion below: with root as the owner it
		// would starve the host's root of inotify for the test's length.
		if owner < ownerIDBase || owner >= ownerIDBase+ownerIDCount || owners[owner] {
			t.Fatalf("sandbox user namespace owned by uid %d (others: %v), want a fresh uid from %d", owner, owners, ownerIDBase)
		}
		owners[owner] = true
	}

	n, e := holdInotify(t, a)
	t.Logf("sandbox a got %d inotify instances, then %v", n, e)
	if e != unix.EMFILE || n == 0 {
		t.Fatalf("sandbox a: %d instances, stopped by %v; want a bounded budget ending in EMFILE", n, e)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("host root cannot create an inotify instance while sandbox a holds %d: %v", n, err)
	}
	unix.Close(fd)
	nb, eb := holdInotify(t, b)
	if nb != n {
		t.Errorf("neighbour sandbox b got %d inotify instances (then %v), want the same budget as a (%d)", nb, eb, n)
	}
}

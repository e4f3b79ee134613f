package namespace

import (
	"encoding/binary"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// runFilter evaluates the sandbox filter on one syscall like the kernel
// does: seccomp_data in native (little-endian) order, loaded as 32-bit
// words. x/net/bpf loads big-endian, so every word is byte-swapped first.
func runFilter(t *testing.T, vm *bpf.VM, archID uint32, nr uint32, args ...uint64) uint32 {
	t.Helper()
	buf := make([]byte, 64)
	binary.LittleEndian.PutUint32(buf[0:], nr)
	binary.LittleEndian.PutUint32(buf[4:], archID)
	for i, a := range args {
		binary.LittleEndian.PutUint64(buf[16+8*i:], a)
	}
	for i := 0; i < len(buf); i += 4 {
		binary.BigEndian.PutUint32(buf[i:], binary.LittleEndian.Uint32(buf[i:]))
	}
	ret, err := vm.Run(buf)
	if err != nil {
		t.Fatal(err)
	}
	return uint32(ret)
}

// TestSeccompPolicy checks the compiled allow list's verdicts: allowed
// calls, known refused calls (EPERM), unknown numbers, x32 and i386
// (ENOSYS), and narrowed sockets.
func TestSeccompPolicy(t *testing.T) {
	if !littleEndian() {
		t.Skip("the word swap in runFilter assumes a little-endian host")
	}
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) > 4096 { // BPF_MAXINSNS
		t.Fatalf("filter has %d instructions, the kernel takes at most 4096", len(prog))
	}
	t.Logf("%d instructions", len(prog))
	vm, err := bpf.NewVM(prog)
	if err != nil {
		t.Fatal(err)
	}
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	nr := func(name string) uint32 {
		n, ok := info.SyscallNames[name]
		if !ok {
			t.Fatalf("no syscall %s", name)
		}
		return uint32(n)
	}
	allow := uint32(retAllow)
	errno := func(e unix.Errno) uint32 { return retErrno | uint32(e) }
	cases := []struct {
		name string
		nr   uint32
		args []uint64
		want uint32
	}{
		{"read", nr("read"), nil, allow},
		{"execve", nr("execve"), nil, allow},
		{"clone thread", nr("clone"), []uint64{unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND}, allow},
		{"clone newuser", nr("clone"), []uint64{unix.CLONE_NEWUSER}, errno(unix.EPERM)},
		{"clone3", nr("clone3"), nil, errno(unix.ENOSYS)},
		{"personality 0", nr("personality"), []uint64{0}, allow},
		{"personality odd", nr("personality"), []uint64{0x0040000}, errno(unix.EPERM)},
		{"io_uring_setup", nr("io_uring_setup"), nil, errno(unix.EPERM)},
		{"mount", nr("mount"), nil, errno(unix.EPERM)},
		{"unknown number", 1000, nil, errno(unix.ENOSYS)},
		{"x32 read", uint32(arch.X32.SeccompMask), nil, errno(unix.ENOSYS)},
		{"socket alg, family in high bits", nr("socket"), []uint64{1<<32 | unix.AF_ALG}, errno(unix.EAFNOSUPPORT)},
		{"socket inet, high bits set", nr("socket"), []uint64{1<<32 | unix.AF_INET}, errno(unix.EAFNOSUPPORT)},
		{"socket inet", nr("socket"), []uint64{unix.AF_INET}, allow},
		{"socket unix", nr("socket"), []uint64{unix.AF_UNIX}, allow},
		{"socket route", nr("socket"), []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, allow},
		{"socket audit", nr("socket"), []uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, errno(unix.EPROTONOSUPPORT)},
		{"socket alg", nr("socket"), []uint64{unix.AF_ALG}, errno(unix.EAFNOSUPPORT)},
		{"socketpair inet", nr("socketpair"), []uint64{unix.AF_INET}, errno(unix.EAFNOSUPPORT)},
	}
	for _, c := range cases {
		if got := runFilter(t, vm, uint32(info.ID), c.nr, c.args...); got != c.want {
			t.Errorf("%s: filter returns %#x, want %#x", c.name, got, c.want)
		}
	}
	if got, want := runFilter(t, vm, 0x40000003 /* AUDIT_ARCH_I386 */, 20), errno(unix.ENOSYS); got != want {
		t.Errorf("i386 entry: filter returns %#x, want %#x", got, want)
	}
}

func littleEndian() bool {
	return binary.NativeEndian.Uint16([]byte{1, 0}) == 1
}

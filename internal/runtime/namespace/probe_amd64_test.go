package namespace

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// syscallAttacks lists what a sandbox tries (numbers are amd64's). Refused
// calls the architecture's table knows get EPERM; calls newer than the
// allow list's table (file_getattr, kernel 6.17) and the x32 ABI get ENOSYS,
// as on a kernel without them; socket families other than unix, inet,
// inet6 and route netlink get EAFNOSUPPORT or EPROTONOSUPPORT, as on a
// kernel built without them.
func syscallAttacks() []syscallAttack {
	var ioUringParams [120]byte
	var ldt [16]byte
	sys := func(name string, want unix.Errno, nr uintptr, args ...uintptr) syscallAttack {
		a := [6]uintptr{}
		copy(a[:], args)
		return syscallAttack{name: name, want: []unix.Errno{want}, call: func() error {
			return rawErr(unix.Syscall6(nr, a[0], a[1], a[2], a[3], a[4], a[5]))
		}}
	}
	const x32 = 0x40000000
	return []syscallAttack{
		sys("io_uring_setup", unix.EPERM, unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&ioUringParams))),
		sys("modify_ldt", unix.EPERM, unix.SYS_MODIFY_LDT, 1, uintptr(unsafe.Pointer(&ldt)), 16),
		sys("fanotify_init", unix.EPERM, unix.SYS_FANOTIFY_INIT, unix.FAN_CLASS_NOTIF|unix.FAN_REPORT_FID, unix.O_RDONLY),
		sys("memfd_secret", unix.EPERM, unix.SYS_MEMFD_SECRET, 0),
		sys("bpf", unix.EPERM, unix.SYS_BPF, 0, 0, 0),
		sys("keyctl", unix.EPERM, unix.SYS_KEYCTL, 0, 0),
		sys("userfaultfd", unix.EPERM, unix.SYS_USERFAULTFD, 0),
		sys("ptrace", unix.EPERM, unix.SYS_PTRACE, unix.PTRACE_TRACEME),
		sys("unshare", unix.EPERM, unix.SYS_UNSHARE, unix.CLONE_NEWUSER),
		sys("clone_newuser", unix.EPERM, unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD)),
		sys("clone3", unix.ENOSYS, unix.SYS_CLONE3, 0, 0),
		sys("file_getattr_newer_than_table", unix.ENOSYS, unix.SYS_FILE_GETATTR, ^uintptr(0), 0, 0, 0, 0),
		sys("x32_getpid", unix.ENOSYS, x32|unix.SYS_GETPID),
		socketAttack("socket_af_alg", unix.AF_ALG, unix.SOCK_SEQPACKET, 0, unix.EAFNOSUPPORT),
		socketAttack("socket_af_vsock", unix.AF_VSOCK, unix.SOCK_STREAM, 0, unix.EAFNOSUPPORT),
		socketAttack("socket_af_packet", unix.AF_PACKET, unix.SOCK_RAW, 0, unix.EAFNOSUPPORT),
		socketAttack("socket_af_alg_high_bits", 1<<32|unix.AF_ALG, unix.SOCK_SEQPACKET, 0, unix.EAFNOSUPPORT),
		socketAttack("netlink_audit", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT, unix.EPROTONOSUPPORT),
		socketAttack("netlink_uevent", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_KOBJECT_UEVENT, unix.EPROTONOSUPPORT),
		socketAttack("allowed_unix", unix.AF_UNIX, unix.SOCK_STREAM, 0, 0),
		socketAttack("allowed_inet", unix.AF_INET, unix.SOCK_STREAM, 0, 0),
		socketAttack("allowed_inet6", unix.AF_INET6, unix.SOCK_DGRAM, 0, 0),
		socketAttack("allowed_netlink_route", unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, 0),
		{name: "allowed_socketpair_unix", want: []unix.Errno{0}, call: func() error {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err == nil {
				unix.Close(fds[0])
				unix.Close(fds[1])
			}
			return err
		}},
		{name: "allowed_fork_exec", want: []unix.Errno{0}, call: func() error {
			pid, err := syscall.ForkExec("/bin/true", []string{"true"}, nil)
			if err == nil {
				var ws unix.WaitStatus
				_, err = unix.Wait4(pid, &ws, 0, nil)
			}
			return err
		}},
	}
}

package namespace

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// keptCaps is what a root shell needs to install packages and manage files,
// by the names container profiles use; everything else (SYS_ADMIN,
// NET_ADMIN, SYS_PTRACE, SYS_MODULE, …) is dropped from every set, including
// the bounding set, so no exec regains it.
var keptCaps = map[string]uintptr{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"CAP_FOWNER": unix.CAP_FOWNER, "CAP_FSETID": unix.CAP_FSETID,
	"CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_NET_RAW": unix.CAP_NET_RAW,
	"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT, "CAP_MKNOD": unix.CAP_MKNOD,
	"CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "CAP_SETFCAP": unix.CAP_SETFCAP,
}

// dropPrivileges cuts capabilities to keptCaps, sets no_new_privs and loads
// the seccomp filter. It acts on the calling thread, which must be the one
// that execs the agent.
func dropPrivileges() error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	var keep uint64
	for _, c := range keptCaps {
		keep |= 1 << c
	}
	for c := 0; c <= last; c++ {
		if keep&(1<<c) != 0 {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("drop cap %d from bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient caps: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{{
		Effective: uint32(keep), Permitted: uint32(keep), Inheritable: uint32(keep),
	}, {
		Effective: uint32(keep >> 32), Permitted: uint32(keep >> 32), Inheritable: uint32(keep >> 32),
	}}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	prog, err := seccompProgram()
	if err != nil {
		return err
	}
	return loadSeccomp(prog)
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

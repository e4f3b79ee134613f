package namespace

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// keptCaps is what a root shell needs to install packages and manage files;
// everything else (SYS_ADMIN, NET_ADMIN, SYS_PTRACE, SYS_MODULE, …) is
// dropped from every set, including the bounding set, so no exec regains it.
var keptCaps = [...]uintptr{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_KILL, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SETPCAP,
	unix.CAP_NET_BIND_SERVICE, unix.CAP_NET_RAW, unix.CAP_SYS_CHROOT,
	unix.CAP_MKNOD, unix.CAP_AUDIT_WRITE, unix.CAP_SETFCAP,
}

// deniedSyscalls fail with EPERM: kernel-wide state, module loading, other
// processes' memory, namespaces and mounts, and rarely used attack surface.
var deniedSyscalls = []string{
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"bpf", "perf_event_open", "keyctl", "add_key", "request_key",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"mount", "umount2", "pivot_root", "setns", "unshare",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	"swapon", "swapoff", "reboot", "open_by_handle_at", "name_to_handle_at",
	"userfaultfd", "acct", "quotactl", "quotactl_fd", "lookup_dcookie",
	"iopl", "ioperm", "syslog", "uselib", "vhangup",
	"clock_settime", "clock_adjtime", "settimeofday", "adjtimex",
	"nfsservctl", "get_kernel_syms", "create_module", "query_module",
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
	filter, err := seccompFilter()
	if err != nil {
		return err
	}
	if err := seccomp.LoadFilter(filter); err != nil {
		return fmt.Errorf("load seccomp filter: %w", err)
	}
	return nil
}

// seccompFilter allows by default and denies deniedSyscalls, creating user
// namespaces through clone, and non-default personalities. clone3 gets
// ENOSYS (its flags live in memory a filter cannot read), so libcs fall back
// to clone, whose flags it can.
func seccompFilter() (seccomp.Filter, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Filter{}, fmt.Errorf("seccomp: %w", err)
	}
	var names []string
	for _, n := range deniedSyscalls {
		if _, ok := info.SyscallNames[n]; ok { // keep only this arch's syscalls
			names = append(names, n)
		}
	}
	personalityOK := []uint64{0, 0x8, 0x20000, 0x20008, 0xffffffff}
	var personality seccomp.ArgumentConditions
	for _, v := range personalityOK {
		personality = append(personality, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: v})
	}
	return seccomp.Filter{
		NoNewPrivs: true,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls: []seccomp.SyscallGroup{
				{Names: names, Action: seccomp.ActionErrno},
				{
					NamesWithCondtions: []seccomp.NameWithConditions{
						{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: unix.CLONE_NEWUSER}}},
						{Name: "personality", Conditions: personality},
					},
					Action: seccomp.ActionErrno,
				},
				{Names: []string{"clone3"}, Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)},
			},
		},
	}, nil
}

func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("read cap_last_cap: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

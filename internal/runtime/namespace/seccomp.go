package namespace

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"unsafe"

	"github.com/elastic/go-seccomp-bpf/arch"
	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// neverAllowed are taken out of the allow list even where Docker's default
// profile has them: other processes' memory, file handles that bypass path
// checks, the clock, and attack surface with a record of local privilege
// escalations (io_uring, modify_ldt, fanotify, memfd_secret, userfaultfd,
// bpf, keyrings). Namespace and mount calls are listed too, although the
// profile already grants them only with CAP_SYS_ADMIN. socket and
// socketpair are narrowed by socketRules instead.
var neverAllowed = []string{
	"init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
	"bpf", "perf_event_open", "keyctl", "add_key", "request_key",
	"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
	"mount", "umount2", "pivot_root", "setns", "unshare",
	"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
	"swapon", "swapoff", "reboot", "open_by_handle_at", "name_to_handle_at",
	"userfaultfd", "acct", "quotactl", "quotactl_fd", "lookup_dcookie",
	"iopl", "ioperm", "syslog", "uselib", "vhangup",
	"clock_settime", "clock_adjtime", "settimeofday", "adjtimex",
	"io_uring_setup", "io_uring_enter", "io_uring_register",
	"modify_ldt", "fanotify_init", "fanotify_mark", "memfd_secret",
	"socket", "socketpair",
}

// Seccomp return values (linux/seccomp.h).
const (
	retAllow = 0x7fff0000
	retErrno = 0x00050000
)

// seccompProgram compiles the sandbox's allow list to classic BPF:
//
//   - allowed: Docker's default profile (github.com/moby/profiles/seccomp)
//     resolved for keptCaps, this architecture and this kernel, less
//     neverAllowed, plus socketRules;
//   - refused with EPERM: every other syscall this architecture's table
//     (github.com/elastic/go-seccomp-bpf/arch) names, and calls whose
//     arguments fail their rule, so code probing a known call sees a
//     policy refusal;
//   - refused with ENOSYS (the default): numbers the table does not know,
//     which are syscalls newer than the profile, the x32 ABI and foreign
//     entry points such as i386's int 0x80. libcs and runtimes fall back
//     from a new syscall only on ENOSYS (glibc's clone3, fchmodat2,
//     close_range…), so a future call must look absent, not forbidden.
//
// The program is one block per syscall, each reloading the syscall number
// after argument checks (go-seccomp-bpf's own compiler compares later
// numbers against a clobbered accumulator). Unconditionally allowed calls
// cost nothing per call: the kernel caches them (SECCOMP_CACHE) and skips
// the filter.
func seccompProgram() ([]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	allow, errnos, err := profileRules(info)
	if err != nil {
		return nil, err
	}
	maps.Copy(allow, socketRules())

	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: retErrno | uint32(unix.ENOSYS)},
	}
	if info.ID == arch.X86_64.ID {
		prog = append(prog, bpf.LoadAbsolute{Off: 0, Size: 4},
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: uint32(arch.X32.SeccompMask), SkipFalse: 1},
			bpf.RetConstant{Val: retErrno | uint32(unix.ENOSYS)})
	}
	final := map[string]bool{} // decided whatever the arguments
	emit := func(r rules, ret uint32) error {
		for _, name := range slices.Sorted(maps.Keys(r)) {
			final[name] = final[name] || r[name] == nil
			block, err := syscallBlock(uint32(info.SyscallNames[name]), r[name], ret)
			if err != nil {
				return fmt.Errorf("seccomp: %s: %w", name, err)
			}
			prog = append(prog, block...)
		}
		return nil
	}
	if err := emit(allow, retAllow); err != nil {
		return nil, err
	}
	for _, e := range slices.Sorted(maps.Keys(errnos)) {
		if err := emit(errnos[e], retErrno|uint32(e)); err != nil {
			return nil, err
		}
	}
	// Sockets of other families fail as on a kernel built without them,
	// which software treats as "not available" (shadow's useradd aborts on
	// EPERM from its audit socket, not on EPROTONOSUPPORT).
	netlink := rules{"socket": {{{Index: 0, Op: specs.OpEqualTo, Value: unix.AF_NETLINK}}}}
	if err := emit(netlink, retErrno|uint32(unix.EPROTONOSUPPORT)); err != nil {
		return nil, err
	}
	if err := emit(rules{"socket": nil, "socketpair": nil}, retErrno|uint32(unix.EAFNOSUPPORT)); err != nil {
		return nil, err
	}
	denied := rules{}
	for name := range info.SyscallNames {
		if !final[name] {
			denied[name] = nil
		}
	}
	if err := emit(denied, retErrno|uint32(unix.EPERM)); err != nil {
		return nil, err
	}
	return append(prog, bpf.RetConstant{Val: retErrno | uint32(unix.ENOSYS)}), nil
}

// rules maps syscall names to alternative argument checks (OCI's: all of
// one alternative must hold); nil means any arguments.
type rules map[string][][]specs.LinuxSeccompArg

// errnoRules are the profile's refusals by errno.
type errnoRules map[unix.Errno]rules

// profileRules resolves Docker's default profile for keptCaps and this
// kernel into allow rules and errno rules, for the calls info knows, less
// neverAllowed.
func profileRules(info *arch.Info) (rules, errnoRules, error) {
	bounding := slices.Collect(maps.Keys(keptCaps))
	profile, err := mobyseccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{Bounding: bounding},
	}})
	if err != nil {
		return nil, nil, fmt.Errorf("seccomp: default profile: %w", err)
	}
	allow, errnos := rules{}, errnoRules{}
	for _, sc := range profile.Syscalls {
		target := allow
		switch sc.Action {
		case specs.ActAllow:
		case specs.ActErrno:
			e := unix.EPERM
			if sc.ErrnoRet != nil {
				e = unix.Errno(*sc.ErrnoRet)
			}
			if errnos[e] == nil {
				errnos[e] = rules{}
			}
			target = errnos[e]
		default:
			return nil, nil, fmt.Errorf("seccomp: default profile action %s is not supported", sc.Action)
		}
		names := slices.DeleteFunc(slices.Clone(sc.Names), func(n string) bool {
			_, known := info.SyscallNames[n]
			return !known || slices.Contains(neverAllowed, n) // another arch's call, or one we take out
		})
		if len(names) == 0 {
			continue
		}
		conds := sc.Args
		for _, n := range names {
			prev, seen := target[n]
			if len(conds) == 0 || (seen && prev == nil) {
				target[n] = nil // unconditional wins over any condition
			} else {
				target[n] = append(prev, conds)
			}
		}
	}
	return allow, errnos, nil
}

// socketRules allow sockets of the families a distribution's tools need:
// unix, IPv4, IPv6, and netlink for NETLINK_ROUTE only (ip, getifaddrs).
// Netlink cannot be made read-only here (a filter cannot read the message a
// sendmsg carries), but the kernel refuses route changes without
// CAP_NET_ADMIN over the network namespace, which the sandbox never has.
func socketRules() rules {
	family := func(f uint64) specs.LinuxSeccompArg {
		return specs.LinuxSeccompArg{Index: 0, Op: specs.OpEqualTo, Value: f}
	}
	return rules{
		"socket": {
			{family(unix.AF_UNIX)}, {family(unix.AF_INET)}, {family(unix.AF_INET6)},
			{family(unix.AF_NETLINK), {Index: 2, Op: specs.OpEqualTo, Value: unix.NETLINK_ROUTE}},
		},
		"socketpair": {{family(unix.AF_UNIX)}},
	}
}

// failJump marks a jump to be pointed past the end of its condition set.
const failJump = 0xff

// syscallBlock returns instructions that return ret when the syscall is nr
// and any of alts matches (or alts is nil), and fall through otherwise.
func syscallBlock(nr uint32, alts [][]specs.LinuxSeccompArg, ret uint32) ([]bpf.Instruction, error) {
	var body []bpf.Instruction
	if alts == nil {
		body = []bpf.Instruction{bpf.RetConstant{Val: ret}}
	}
	for _, conds := range alts {
		var set []bpf.Instruction
		for _, c := range conds {
			ins, err := argCheck(c)
			if err != nil {
				return nil, err
			}
			set = append(set, ins...)
		}
		set = append(set, bpf.RetConstant{Val: ret})
		for i, in := range set { // fail: on to the next alternative
			if j, ok := in.(bpf.JumpIf); ok {
				skip := uint8(len(set) - 1 - i)
				if j.SkipTrue == failJump {
					j.SkipTrue = skip
				}
				if j.SkipFalse == failJump {
					j.SkipFalse = skip
				}
				set[i] = j
			}
		}
		body = append(body, set...)
	}
	if len(body) > 255 {
		return nil, fmt.Errorf("rule too long")
	}
	return append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: nr, SkipTrue: uint8(len(body))},
	}, body...), nil
}

// argCheck compares one 64-bit argument, in two 32-bit halves; a failed
// check jumps with failJump, a passed one falls through.
func argCheck(c specs.LinuxSeccompArg) ([]bpf.Instruction, error) {
	lo, hi := uint32(16+8*c.Index), uint32(16+8*c.Index+4) // seccomp_data.args
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		lo, hi = hi, lo
	}
	half := func(off, v, v2 uint32) []bpf.Instruction {
		ld := bpf.LoadAbsolute{Off: off, Size: 4}
		switch c.Op {
		case specs.OpEqualTo:
			return []bpf.Instruction{ld, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipFalse: failJump}}
		case specs.OpMaskedEqual: // (arg & Value) == ValueTwo
			return []bpf.Instruction{ld, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: v},
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: v2, SkipFalse: failJump}}
		}
		return nil
	}
	switch c.Op {
	case specs.OpEqualTo, specs.OpMaskedEqual:
		return append(half(hi, uint32(c.Value>>32), uint32(c.ValueTwo>>32)),
			half(lo, uint32(c.Value), uint32(c.ValueTwo))...), nil
	case specs.OpNotEqual:
		return []bpf.Instruction{
			bpf.LoadAbsolute{Off: hi, Size: 4}, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(c.Value >> 32), SkipFalse: 2},
			bpf.LoadAbsolute{Off: lo, Size: 4}, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(c.Value), SkipTrue: failJump},
		}, nil
	}
	return nil, fmt.Errorf("argument operator %s is not supported", c.Op)
}

// loadSeccomp sets no_new_privs and installs prog on the calling thread.
func loadSeccomp(prog []bpf.Instruction) error {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return fmt.Errorf("assemble seccomp filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("load seccomp filter: %w", e)
	}
	return nil
}

package gvisor

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Files written into a sandbox's bundle directory (stateDir/<id>/).
const (
	configFile  = "config.json"
	runscLog    = "runsc.log"
	consoleFile = "console.log"
	// pidFile is where runsc writes the Sentry's pid at start (--pid-file).
	pidFile = "sandbox.pid"
)

// cpuPeriod is the CFS period, in microseconds, against which MilliCPUs is
// turned into a quota: 1000 milli-CPUs is one period's worth of quota.
const cpuPeriod = 100_000

// rootCapabilities is what a root shell in a container normally has (Docker's
// default set). It is enough for apt-get, chown, su and ping, and leaves out
// SYS_ADMIN, SYS_PTRACE, NET_ADMIN and friends. Inside gVisor these
// capabilities act on the Sentry's emulated kernel, not the host's.
var rootCapabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE",
	"CAP_NET_RAW",
	"CAP_SYS_CHROOT",
	"CAP_MKNOD",
	"CAP_AUDIT_WRITE",
	"CAP_SETFCAP",
}

// agentOwnCapability is what the agent holds and commands do not: setting
// the hostname takes it (runtime.AgentIdentifier). Docker inside gives
// commands CAP_SYS_ADMIN anyway (dockerCapabilities).
const agentOwnCapability = "CAP_SYS_ADMIN"

// writeBundle writes config.json into dir, the sandbox's bundle
// directory, which must exist. saved, when not nil, replaces the tmpfs
// mounts and rlimits derived from spec (a restore must have what its
// checkpoint had).
func writeBundle(dir string, spec runtime.Spec, saved *savedSpec) error {
	data, err := json.MarshalIndent(ociSpec(spec, saved), "", "  ")
	if err != nil {
		return fmt.Errorf("encode OCI config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), data, 0o644); err != nil {
		return fmt.Errorf("write OCI config: %w", err)
	}
	return nil
}

// ociSpec builds the OCI runtime config for spec, with saved's tmpfs
// mounts and rlimits when saved is not nil.
func ociSpec(spec runtime.Spec, saved *savedSpec) *specs.Spec {
	caps := append([]string(nil), rootCapabilities...)
	tmpfs, rl := tmpfsMounts(spec), rlimits(spec.Limits)
	var other []specs.Mount
	var annotations map[string]string
	env := agentEnv(spec)
	if spec.Docker {
		caps = append(caps, dockerCapabilities...)
		var dt []specs.Mount
		dt, other = dockerMounts(spec.Limits)
		tmpfs = append(tmpfs, dt...)
		annotations = map[string]string{dockerAnnotation: "true"}
	} else {
		// The agent's own (agent.OwnCapsEnv): dropped from the bounding
		// set, so no command gets it, before the agent starts any.
		caps = append(caps, agentOwnCapability)
		env = append(env, agent.OwnCapsEnv+"="+agentOwnCapability)
	}
	if saved != nil {
		tmpfs, rl = saved.Tmpfs, saved.Rlimits
	}
	return &specs.Spec{
		Version:     specs.Version,
		Annotations: annotations,
		Root:        &specs.Root{Path: spec.RootFS},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{runtime.AgentMountPath, "agent"},
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits: rl,
		},
		Hostname: spec.Hostname,
		Mounts:   append(append(append(mounts(spec.AgentBinary), tmpfs...), other...), binds(spec.Mounts)...),
		Linux: &specs.Linux{
			CgroupsPath: "/cubicle/" + spec.ID,
			Resources:   resources(spec.ID, spec.Limits),
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.NetworkNamespace, Path: spec.NetNS},
			},
		},
	}
}

// agentEnv is PID 1's environment: spec.Env plus the memory limit, which
// turns on the agent's OOM guard (gVisor has no OOM killer of its own; see
// hostMemLimit).
func agentEnv(spec runtime.Spec) []string {
	env := append([]string(nil), spec.Env...)
	if spec.Limits.MemBytes > 0 {
		env = append(env, fmt.Sprintf("%s=%d", agent.MemLimitEnv, spec.Limits.MemBytes))
	}
	return env
}

// mounts lists the sandbox's mounts. runsc supplies /dev itself, as an
// unsized tmpfs whatever the options say, so it is read-only: a file
// written there would be memory no kill frees (its submounts /dev/pts and
// /dev/shm stay writable). The agent is bound read-only so that nothing
// inside can replace PID 1's binary. resolv.conf and hosts are files of the
// rootfs (runtime.WriteNetFiles), which root inside may edit.
func mounts(agentBinary string) []specs.Mount {
	ro := []string{"rbind", "ro"}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "ro"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: runtime.AgentMountPath, Type: "bind", Source: agentBinary, Options: ro},
	}
}

// binds are spec's host directories; the gofer serves them like the root.
func binds(ms []runtime.Mount) []specs.Mount {
	out := make([]specs.Mount, 0, len(ms))
	for _, m := range ms {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		out = append(out, specs.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: []string{"rbind", mode, "nosuid", "nodev"}})
	}
	return out
}

// tmpfsMounts are the sandbox's writable tmpfs mounts, each of
// Limits.TmpfsBytes, since the Sentry keeps their pages in the sandbox's
// memory: /dev/shm, and /tmp unless the image has files there. runsc would
// otherwise mount an unsized tmpfs over an empty (or missing) /tmp itself;
// a /tmp symlink gets the sized mount too, which runsc resolves inside the
// sandbox's root.
func tmpfsMounts(spec runtime.Spec) []specs.Mount {
	size := fmt.Sprintf("size=%d", spec.Limits.TmpfsBytes())
	m := []specs.Mount{{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", size}}}
	if !keepsImageTmp(filepath.Join(spec.RootFS, "tmp")) {
		m = append(m, specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", size}})
	}
	return m
}

// keepsImageTmp reports whether the rootfs's /tmp (host path p) must stay
// as it is: a directory with files in it, or something that is neither a
// directory nor a symlink (a mount over it would fail the boot). It never
// follows a symlink on the host and reads at most one name, so a /tmp the
// sandbox filled with millions of entries costs the daemon nothing.
func keepsImageTmp(p string) bool {
	fi, err := os.Lstat(p)
	switch {
	case err != nil:
		return false
	case fi.Mode()&os.ModeSymlink != 0:
		return false
	case !fi.IsDir():
		return true
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return true
	}
	defer f.Close()
	_, err = f.Readdirnames(1)
	return err != io.EOF
}

// rlimits are PID 1's resource limits, inherited by everything inside.
// RLIMIT_NPROC carries the task bound (Limits.Tasks) into the Sentry, which
// enforces it per uid on every clone (EAGAIN) even for root, because the
// sandbox lacks CAP_SYS_ADMIN and CAP_SYS_RESOURCE (so it cannot raise it
// either). That stops a fork bomb inside the sandbox while the sandbox
// itself stays healthy. runsc applies linux.resources.pids only to the host
// cgroup, never inside the Sentry, so the host pids cgroup is only a
// backstop (see hostPidsLimit).
func rlimits(l runtime.Limits) []specs.POSIXRlimit {
	r := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}}
	if n := l.Tasks(); n > 0 {
		r = append(r, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(n), Soft: uint64(n)})
	}
	return r
}

// resources turns Limits into OCI cgroup resources; zero fields stay unset.
// Memory is the sandbox's own limit, which runsc reports as MemTotal inside;
// Start then raises the host cgroup to hostMemLimit.
//
// A sandbox with fewer vCPUs than the host has CPUs gets a cpuset of that
// many (runtime.CPUs): runsc sizes the Sentry's CPU count from the
// cgroup's cpuset, and otherwise never reports fewer than 2.
func resources(id string, l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if l.MemBytes > 0 {
		mem := l.MemBytes
		r.Memory = &specs.LinuxMemory{Limit: &mem}
	}
	if n := l.Tasks(); n > 0 {
		r.Pids = &specs.LinuxPids{Limit: hostPidsLimit(n)}
	}
	if l.MilliCPUs > 0 {
		quota := l.MilliCPUs * cpuPeriod / 1000
		period := uint64(cpuPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
		if allowed, err := runtime.AllowedCPUs(); err == nil {
			r.CPU.Cpus = runtime.CPUList(runtime.CPUs(id, l, allowed))
		}
	}
	if l.Background {
		if r.CPU == nil {
			r.CPU = &specs.LinuxCPU{}
		}
		shares := l.CPUShares()
		r.CPU.Shares = &shares
	}
	return r
}

// hostPidsLimit is the host pids cgroup limit for a sandbox whose tasks are
// limited to tasks. The host sees the Sentry's and gofer's own threads
// (27 for an idle sandbox on a 2-core host, more when a busy host makes the
// Go runtime add threads) and systrap's stub processes and threads
// (measured: 2,069 host pids for 1,020 sleeping tasks) besides the
// sandbox's tasks, and a Sentry that cannot create a thread dies, taking
// the whole sandbox with it. So the host limit is a generous backstop above
// what RLIMIT_NPROC allows inside: it only bites when tasks of several uids
// add up, and then only that sandbox dies.
func hostPidsLimit(tasks int64) int64 {
	return 3*tasks + 512
}

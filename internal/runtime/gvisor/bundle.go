package gvisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Files written into a sandbox's bundle directory (stateDir/<id>/).
const (
	configFile  = "config.json"
	runscLog    = "runsc.log"
	consoleFile = "console.log"
)

// fallbackNameserver is used when the host has no nameserver a sandbox can
// reach (none at all, or only loopback ones such as systemd-resolved's
// 127.0.0.53, which lives in the host's network namespace).
const fallbackNameserver = "1.1.1.1"

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

// writeBundle writes config.json into dir, the sandbox's bundle
// directory, which must exist.
func writeBundle(dir string, spec runtime.Spec) error {
	data, err := json.MarshalIndent(ociSpec(spec), "", "  ")
	if err != nil {
		return fmt.Errorf("encode OCI config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, configFile), data, 0o644); err != nil {
		return fmt.Errorf("write OCI config: %w", err)
	}
	return nil
}

// ociSpec builds the OCI runtime config for spec.
func ociSpec(spec runtime.Spec) *specs.Spec {
	caps := append([]string(nil), rootCapabilities...)
	return &specs.Spec{
		Version: specs.Version,
		Root:    &specs.Root{Path: spec.RootFS},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: []string{runtime.AgentMountPath, "agent"},
			Env:  agentEnv(spec),
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits: rlimits(spec.Limits),
		},
		Hostname: spec.Hostname,
		Mounts:   mounts(spec.AgentBinary),
		Linux: &specs.Linux{
			CgroupsPath: "/cubicle/" + spec.ID,
			Resources:   resources(spec.Limits),
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

// mounts lists the sandbox's mounts. runsc supplies /dev itself; the agent
// is bound read-only so that nothing inside can replace PID 1's binary.
// resolv.conf and hosts are files of the rootfs (runtime.WriteNetFiles),
// which root inside may edit.
func mounts(agentBinary string) []specs.Mount {
	ro := []string{"rbind", "ro"}
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: runtime.AgentMountPath, Type: "bind", Source: agentBinary, Options: ro},
	}
}

// rlimits are PID 1's resource limits, inherited by everything inside.
// RLIMIT_NPROC carries PidsMax into the Sentry, which enforces it per uid on
// every clone (EAGAIN) even for root, because the sandbox lacks
// CAP_SYS_ADMIN and CAP_SYS_RESOURCE. That stops a fork bomb inside the
// sandbox while the sandbox itself stays healthy; the host pids cgroup is
// only a backstop (see hostPidsLimit).
func rlimits(l runtime.Limits) []specs.POSIXRlimit {
	r := []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}}
	if l.PidsMax > 0 {
		r = append(r, specs.POSIXRlimit{Type: "RLIMIT_NPROC", Hard: uint64(l.PidsMax), Soft: uint64(l.PidsMax)})
	}
	return r
}

// resources turns Limits into OCI cgroup resources; zero fields stay unset.
// Memory is the sandbox's own limit, which runsc reports as MemTotal inside;
// Start then raises the host cgroup to hostMemLimit.
func resources(l runtime.Limits) *specs.LinuxResources {
	r := &specs.LinuxResources{}
	if l.MemBytes > 0 {
		mem := l.MemBytes
		r.Memory = &specs.LinuxMemory{Limit: &mem}
	}
	if l.PidsMax > 0 {
		r.Pids = &specs.LinuxPids{Limit: hostPidsLimit(l.PidsMax)}
	}
	if l.MilliCPUs > 0 {
		quota := l.MilliCPUs * cpuPeriod / 1000
		period := uint64(cpuPeriod)
		r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	return r
}

// hostPidsLimit is the host pids cgroup limit for a sandbox whose tasks are
// limited to pidsMax. The host sees the Sentry's and gofer's own threads
// (27 for an idle sandbox on a 2-core host) and systrap's stub processes and
// threads (measured: about 1.5 per task) besides the sandbox's tasks, and a
// Sentry that cannot create a thread dies, taking the whole sandbox with it.
// So the host limit is a generous backstop above what RLIMIT_NPROC allows
// inside: it only bites when tasks of several uids add up, and then only
// that sandbox dies.
func hostPidsLimit(pidsMax int64) int64 {
	return 2*pidsMax + 256
}

// resolvConf builds the sandbox's resolv.conf from the host's (read from
// hostResolv): its non-loopback nameservers and search line, or
// fallbackNameserver when none is usable. A missing host file is not an
// error.
func resolvConf(hostResolv string) ([]byte, error) {
	data, err := os.ReadFile(hostResolv)
	if err != nil && !os.IsNotExist(err) {
		return nil, fmt.Errorf("read host resolv.conf: %w", err)
	}
	var servers []string
	var search string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "nameserver":
			addr, err := netip.ParseAddr(f[1])
			if err != nil || addr.IsLoopback() || addr.IsUnspecified() {
				continue
			}
			servers = append(servers, addr.String())
		case "search":
			search = strings.Join(f[1:], " ")
		}
	}
	if len(servers) == 0 {
		servers = []string{fallbackNameserver}
	}
	var b bytes.Buffer
	if search != "" {
		fmt.Fprintf(&b, "search %s\n", search)
	}
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	return b.Bytes(), nil
}

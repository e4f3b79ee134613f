package gvisor

import (
	"fmt"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Docker inside a sandbox (runtime.Spec.Docker), as gVisor's own
// "Docker in gVisor" guide sets it up. Everything it grants is granted by
// the Sentry, gVisor's user-space kernel, to the processes it runs: the
// host kernel sees the same Sentry, gofer and seccomp filters as for any
// other sandbox, and nothing new reaches it.
//
//   - runsc --net-raw: raw sockets (CAP_NET_RAW stays in the set) on
//     gVisor's own network stack (netstack), which dockerd and the nested
//     containers' ping use;
//   - runsc --allow-packet-socket-write: writes on AF_PACKET sockets, for
//     the unsolicited ARP/NA dockerd sends when it brings up a veth. The
//     packets leave through the sandbox's one veth, where the host's
//     nftables rules (default-deny towards the host, the egress policy,
//     the proxy's redirect of 80/443) apply to them as to any other;
//   - CAP_SYS_ADMIN, CAP_NET_ADMIN and CAP_SYS_PTRACE in the sandbox's
//     capability sets: mounts (overlay, proc, bind), namespaces, netstack's
//     iptables, bridges and veths, all of them objects of the Sentry. With
//     CAP_SYS_ADMIN, RLIMIT_NPROC no longer binds root inside (see
//     rlimits), so the host pids cgroup is then root's only task bound;
//   - a tmpfs at /var/lib/docker (half the sandbox's memory): gVisor
//     mounts overlayfs only over a tmpfs upper layer, and dockerd's overlay2
//     storage driver needs one. Its pages are sandbox memory, so pulled and
//     built images are gone at a stop unless memory is preserved;
//   - cgroupfs at /sys/fs/cgroup: gVisor's emulated cgroup v1 hierarchy,
//     for runc inside.
const dockerAnnotation = "dev.cubicle.docker"

// dockerFlags are the runsc flags of a sandbox with Docker inside.
var dockerFlags = []string{"--net-raw", "--allow-packet-socket-write"}

// dockerCapabilities are added to rootCapabilities for Docker inside: what
// gVisor's guide lists for dockerd beyond Docker's default set.
var dockerCapabilities = []string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_PTRACE"}

// dockerDir is where dockerd keeps its images and containers.
const dockerDir = "/var/lib/docker"

// defaultDockerTmpfsBytes sizes dockerDir in a sandbox without a memory
// limit (gVisor's own start-dockerd.sh default).
const defaultDockerTmpfsBytes = 2 << 30

var _ runtime.DockerHost = (*Driver)(nil)

// DockerInside implements runtime.DockerHost.
func (d *Driver) DockerInside() string {
	return fmt.Sprintf("runsc %v, %v inside gVisor, tmpfs %s, cgroupfs", dockerFlags, dockerCapabilities, dockerDir)
}

// dockerTmpfsBytes is the size of dockerDir's tmpfs for limits l.
func dockerTmpfsBytes(l runtime.Limits) int64 {
	if l.MemBytes <= 0 {
		return defaultDockerTmpfsBytes
	}
	return l.MemBytes / 2
}

// dockerMounts are the mounts Docker inside adds: the tmpfs (a tmpfs
// mount, saved with a checkpoint like the others) and cgroupfs.
func dockerMounts(l runtime.Limits) (tmpfs, other []specs.Mount) {
	tmpfs = []specs.Mount{{Destination: dockerDir, Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "nodev", "mode=0710", fmt.Sprintf("size=%d", dockerTmpfsBytes(l))}}}
	other = []specs.Mount{{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev"}}}
	return tmpfs, other
}

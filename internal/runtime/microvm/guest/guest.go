// Package guest is PID 1 of a microVM guest before it becomes the agent:
// the initramfs's /init (the cubicle-agent binary under that name). It
// mounts the sandbox's root filesystem, which the host serves over 9p,
// bounds the workload with the guest kernel's own cgroups, drops what root
// inside must not have, switches root and execs the agent.
//
// It imports nothing of the host-side driver, so the in-sandbox binary
// stays small.
package guest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent/vport"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// ConfigPath is where the host puts Config in the initramfs. Init reads it
// and removes it before anything of the sandbox runs: the token it holds
// must be in no file the sandbox can read.
const ConfigPath = "/cubicle.json"

// RootTag is the 9p mount tag of the sandbox's root filesystem; bind mounts
// are MountTag(i).
const RootTag = "root"

// AgentPortName is the name of the virtio-serial port the agent serves its
// API on (see vport); it is the VM's only such port.
const AgentPortName = "cubicle.agent"

// portWait bounds how long init waits for the agent's port to appear: the
// guest kernel adds it once the host's virtio-serial device has announced
// it, which under TCG can trail init's start.
const portWait = 20 * time.Second

// MountTag is the 9p tag of the i-th entry of Config.Mounts.
func MountTag(i int) string { return "m" + strconv.Itoa(i) }

// Config is what the host tells the guest's init.
type Config struct {
	Hostname string   `json:"hostname"`
	Env      []string `json:"env"`
	Token    string   `json:"token"`
	// Mounts are 9p shares (tags MountTag(i)) to mount at their targets.
	Mounts []Mount `json:"mounts,omitempty"`
	// MemBytes bounds the workload (agent included) with a guest memory
	// cgroup; the guest has some more RAM for its kernel, so an
	// over-limit process is OOM-killed while the guest lives.
	MemBytes int64 `json:"mem_bytes,omitempty"`
	// Tasks bounds processes and threads (runtime.Limits.Tasks).
	Tasks int64 `json:"tasks,omitempty"`
	// ShmBytes sizes /dev/shm (runtime.Limits.TmpfsBytes).
	ShmBytes int64 `json:"shm_bytes"`
	// HostTimeNanos is the host's clock (Unix ns) as QEMU was about to
	// start: the guest has no clock device (an RTC takes an interrupt
	// line the virtio devices need), so init sets its clock to this plus
	// the time since the guest kernel booted, which leaves it behind by
	// QEMU's own setup (tens of ms under KVM, a few hundred under TCG).
	HostTimeNanos int64 `json:"host_time_ns"`
}

// Mount is one bind mount, served as a 9p share.
type Mount struct {
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// droppedCaps are taken from every set, the bounding set included, before
// the agent runs. Root inside a microVM keeps the rest (SYS_ADMIN,
// NET_ADMIN: it may mount, set up its own netfilter, run containers), as
// the kernel it has is its own. Without SYS_PTRACE no process can read the
// agent's memory (and token); without SYS_RAWIO none can reach I/O ports
// or raw devices; module loading and kexec are not built into the kernel.
var droppedCaps = []uintptr{unix.CAP_SYS_PTRACE, unix.CAP_SYS_RAWIO, unix.CAP_SYS_MODULE, unix.CAP_SYS_BOOT}

// Main runs init; it returns only on failure, after which the caller
// powers the guest off (PID 1 exiting panics the kernel, which ends the VM).
func Main() error {
	// Capabilities are per thread: the thread that drops them must be the
	// one that starts the agent, so init stays on one.
	goruntime.LockOSThread()
	if err := mount("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, ""); err != nil {
		return err
	}
	console, err := os.OpenFile("/dev/console", os.O_WRONLY, 0)
	if err == nil {
		unix.Dup3(int(console.Fd()), 1, 0)
		unix.Dup3(int(console.Fd()), 2, 0)
		console.Close()
	}
	data, err := os.ReadFile(ConfigPath)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	os.Remove(ConfigPath)
	var cfg Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("decode config: %w", err)
	}
	if err := setClock(cfg.HostTimeNanos); err != nil {
		return err
	}
	if err := mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	// Allocations succeed and the memory cgroup's OOM killer ends the
	// process that goes over (exit 137), as on the other runtimes; the
	// default heuristic would fail a large malloc with ENOMEM instead.
	if err := os.WriteFile("/proc/sys/vm/overcommit_memory", []byte("1"), 0); err != nil {
		return fmt.Errorf("overcommit: %w", err)
	}
	if err := limitWorkload(cfg); err != nil {
		return err
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	// The port is opened while the initramfs's /dev shows it; the agent
	// inherits it, and as a port takes one opener at a time, nothing of
	// the sandbox can open it after.
	port, err := openPort()
	if err != nil {
		return err
	}
	if err := setupRoot(cfg); err != nil {
		return err
	}
	if err := dropCaps(); err != nil {
		return err
	}
	return runAgent(cfg.Token, runtime.DefaultEnv(cfg.Env), port)
}

// agentArg makes the binary the agent's starter: PID 1 of the sandbox's
// pid namespace, which mounts that namespace's /proc and execs the agent.
const agentArg = "vm-agent"

// runAgent starts the agent as PID 1 of a new pid namespace, its token on
// standard input, and waits for it: the sandbox sees its own processes
// only, not the guest kernel's threads or this init. When the agent ends,
// so does the guest.
func runAgent(token string, env []string, port *os.File) error {
	r, err := runtime.TokenPipe(token)
	if err != nil {
		return err
	}
	cmd := exec.Command(runtime.AgentMountPath, agentArg)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{port} // fd 3
	cmd.Env = append(env, vport.FDEnv+"=3")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	err = cmd.Start()
	r.Close()
	if err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	return fmt.Errorf("agent exited: %w", cmd.Wait())
}

// openPort opens the agent's virtio-serial port (the guest's only one,
// /dev/vport<device>p<n>) once the kernel has added it.
func openPort() (*os.File, error) {
	deadline := time.Now().Add(portWait)
	for {
		ports, _ := filepath.Glob("/dev/vport*p*")
		switch {
		case len(ports) == 1:
			f, err := os.OpenFile(ports[0], os.O_RDWR, 0)
			if err != nil {
				return nil, fmt.Errorf("open agent port: %w", err)
			}
			return f, nil
		case len(ports) > 1:
			return nil, fmt.Errorf("agent port: %d virtio-serial ports, want %s alone", len(ports), AgentPortName)
		case time.Now().After(deadline):
			return nil, fmt.Errorf("agent port: none appeared within %v", portWait)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// startAgent is PID 1 of the sandbox's pid namespace: a /proc of that
// namespace, then the agent.
func startAgent() error {
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	err := unix.Exec(runtime.AgentMountPath, []string{runtime.AgentMountPath, "agent"}, os.Environ())
	return fmt.Errorf("exec agent: %w", err)
}

// setClock sets the wall clock from the host's time at launch (see
// Config.HostTimeNanos).
func setClock(hostNanos int64) error {
	if hostNanos <= 0 {
		return nil
	}
	var up unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &up); err != nil {
		return fmt.Errorf("boot time: %w", err)
	}
	now := unix.NsecToTimespec(hostNanos + up.Nano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &now); err != nil {
		return fmt.Errorf("set clock: %w", err)
	}
	return nil
}

// limitWorkload puts init (and so the agent and everything it runs) into a
// cgroup bounding memory and tasks. The cgroup tree is mounted only here,
// in the initramfs, which is unreachable once root is switched.
func limitWorkload(cfg Config) error {
	const dir = "/cgroup"
	if err := mount("cgroup2", dir, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := os.WriteFile(dir+"/cgroup.subtree_control", []byte("+memory +pids"), 0); err != nil {
		return fmt.Errorf("cgroup controllers: %w", err)
	}
	sb := dir + "/sandbox"
	if err := os.Mkdir(sb, 0o755); err != nil {
		return fmt.Errorf("sandbox cgroup: %w", err)
	}
	if cfg.MemBytes > 0 {
		if err := os.WriteFile(sb+"/memory.max", []byte(strconv.FormatInt(cfg.MemBytes, 10)), 0); err != nil {
			return fmt.Errorf("memory.max: %w", err)
		}
	}
	if cfg.Tasks > 0 {
		if err := os.WriteFile(sb+"/pids.max", []byte(strconv.FormatInt(cfg.Tasks, 10)), 0); err != nil {
			return fmt.Errorf("pids.max: %w", err)
		}
	}
	if err := os.WriteFile(sb+"/cgroup.procs", []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		return fmt.Errorf("join sandbox cgroup: %w", err)
	}
	return unix.Unmount(dir, unix.MNT_DETACH)
}

// ninep mounts the 9p share tag at target. cache=mmap keeps no file data
// cached in the guest beyond mmap'd pages, so the host's view of the
// sandbox's files (captures, diffs, the file record) is current.
func ninep(tag, target string, flags uintptr) error {
	return mount(tag, target, "9p", flags, "trans=virtio,version=9p2000.L,msize=524288,cache=mmap,access=client")
}

// setupRoot mounts the root share at /newroot with the kernel interfaces,
// the agent binary and the bind mounts, and makes it the root.
func setupRoot(cfg Config) error {
	const nr = "/newroot"
	if err := ninep(RootTag, nr, 0); err != nil {
		return err
	}
	// The agent binary is this initramfs's /init, copied to a tmpfs of its
	// own (read-only once written) so it outlives the initramfs.
	agentDir := nr + path.Dir(runtime.AgentMountPath)
	if err := os.MkdirAll(agentDir, 0o755); err != nil {
		return fmt.Errorf("agent dir: %w", err)
	}
	self, err := os.ReadFile("/init")
	if err != nil {
		return fmt.Errorf("read agent: %w", err)
	}
	if err := mount("tmpfs", agentDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=0755,size=%d", len(self)+(1<<20))); err != nil {
		return err
	}
	if err := os.WriteFile(nr+runtime.AgentMountPath, self, 0o755); err != nil {
		return fmt.Errorf("write agent: %w", err)
	}
	if err := unix.Mount("", agentDir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("agent read-only: %w", err)
	}
	for i, m := range cfg.Mounts {
		t := nr + m.Target
		if err := os.MkdirAll(t, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", m.Target, err)
		}
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if m.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := ninep(MountTag(i), t, flags); err != nil {
			return err
		}
	}
	for _, d := range []string{"/proc", "/sys", "/dev"} {
		if err := os.MkdirAll(nr+d, 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", d, err)
		}
	}
	if err := mount("sysfs", nr+"/sys", "sysfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, ""); err != nil {
		return err
	}
	if err := setupDev(nr+"/dev", cfg.ShmBytes); err != nil {
		return err
	}
	// 9p serves no special files (QEMU refuses to open sockets, FIFOs and
	// device nodes on the host's side), so where programs make them the
	// guest has memory of its own: /run always (it is volatile by
	// convention), /tmp unless the image keeps files there.
	if err := mount("tmpfs", nr+"/run", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=0755,size=%d", tmpfsBytes(cfg)/4)); err != nil {
		return err
	}
	if empty(nr + "/tmp") {
		if err := mount("tmpfs", nr+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=1777,size=%d", tmpfsBytes(cfg))); err != nil {
			return err
		}
	}
	if err := unix.Unmount("/dev", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount initramfs /dev: %w", err)
	}
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount initramfs /proc: %w", err)
	}
	// switch_root: what is left of the initramfs is freed with the agent
	// copy made; nothing of it stays reachable.
	os.Remove("/init")
	if err := unix.Chdir(nr); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// devBytes sizes the guest's /dev: a tmpfs holding only nodes, dirs and
// links (the kernel's devtmpfs, with every device of the guest and no size
// bound, is never shown to the sandbox).
const devBytes = 1 << 20

// devices are the nodes of /dev: name, major, minor.
var devices = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}}

// setupDev mounts a small tmpfs at dev with the usual nodes, pts, a sized
// shm and the usual symlinks.
func setupDev(dev string, shmBytes int64) error {
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, fmt.Sprintf("mode=0755,size=%d", devBytes)); err != nil {
		return err
	}
	for _, n := range devices {
		if err := unix.Mknod(dev+"/"+n.name, unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", n.name, err)
		}
		if err := os.Chmod(dev+"/"+n.name, 0o666); err != nil { // past the umask
			return err
		}
	}
	if err := mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return err
	}
	if shmBytes <= 0 {
		shmBytes = runtime.DefaultTmpfsBytes
	}
	if err := mount("shm", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=1777,size=%d", shmBytes)); err != nil {
		return err
	}
	links := [][2]string{
		{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"},
		{"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"},
	}
	for _, l := range links {
		if err := os.Symlink(l[0], dev+"/"+l[1]); err != nil {
			return err
		}
	}
	return nil
}

// tmpfsBytes sizes /tmp (and, a quarter of it, /run).
func tmpfsBytes(cfg Config) int64 {
	if cfg.ShmBytes > 0 {
		return cfg.ShmBytes
	}
	return runtime.DefaultTmpfsBytes
}

// empty reports whether dir is missing or has no entries (an image's /tmp
// with files keeps them, on the rootfs).
func empty(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return true
	}
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) == 0
}

func dropCaps() error {
	for _, c := range droppedCaps {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, c, 0, 0, 0); err != nil {
			return fmt.Errorf("drop cap %d from bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, c := range droppedCaps {
		i, bit := c/32, uint32(1)<<(c%32)
		data[i].Effective &^= bit
		data[i].Permitted &^= bit
		data[i].Inheritable &^= bit
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

func mount(source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", target, err)
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s: %w", fstype, target, err)
	}
	return nil
}

// IsInit reports whether this process is a microVM guest's /init: PID 1
// started by the kernel from the initramfs
// (or the agent's starter in the sandbox's pid namespace: see runAgent).
func IsInit() bool {
	return os.Getpid() == 1 && (os.Args[0] == "/init" || len(os.Args) == 2 && os.Args[1] == agentArg)
}

// Run is Main for main functions: on failure it says why on the console
// and powers the guest off, which ends the VM (the driver reports it).
func Run() {
	var err error
	if os.Args[0] == "/init" {
		err = Main()
	} else {
		err = startAgent()
	}
	fmt.Fprintf(os.Stderr, "cubicle guest init: %v\n", err)
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	os.Exit(1)
}

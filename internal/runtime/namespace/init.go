package namespace

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	goruntime "runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// InitArg is the first argument that makes a binary act as the sandbox init
// (see Init). The daemon's binary handles it as the hidden `cubicle nsinit`.
const InitArg = "nsinit"

// File descriptors handed to init by Start.
const (
	configFD     = 3 // read: initConfig as JSON; EOF means "cgroups joined, go"
	statusFD     = 4 // write, close-on-exec: error text, or EOF once the agent is exec'd
	firstMountFD = 5 // detached mounts listed in initConfig.Mounts
)

// initConfig is what Start tells init, over configFD.
type initConfig struct {
	Hostname string    `json:"hostname"`
	Env      []string  `json:"env"`
	Mounts   []fdMount `json:"mounts"`
	// SysFD is a read-only sysfs mounted by the daemon from the sandbox's
	// netns (a user namespace may not mount sysfs for a netns it does not
	// own).
	SysFD int `json:"sys_fd"`
	// Token is the agent's, put on its standard input (runtime.Spec.Token).
	Token string `json:"token"`
	// ShmBytes sizes /dev/shm (runtime.Limits.TmpfsBytes): its pages are
	// charged to the sandbox's memory cgroup and no OOM kill frees them.
	ShmBytes int64 `json:"shm_bytes"`
	// CPUInfo, when set, is shown as /proc/cpuinfo (see cpuInfo): the
	// stanzas of the CPUs the sandbox is pinned to.
	CPUInfo string `json:"cpuinfo,omitempty"`
}

// Init is the entry point of the sandbox's PID 1 before it becomes the agent.
// Run it when os.Args[1] == InitArg, first thing in main (or TestMain); it
// never returns. It runs as root of the new user namespace, builds the
// sandbox's filesystem, drops privileges and execs the agent.
func Init() {
	// Namespaces, credentials and seccomp below are per thread; exec happens
	// from this same thread, so the agent inherits exactly them.
	goruntime.LockOSThread()
	unix.FcntlInt(statusFD, unix.F_SETFD, unix.FD_CLOEXEC)
	err := runInit()
	msg := fmt.Sprintf("nsinit: %v\n", err)
	unix.Write(statusFD, []byte(msg))
	os.Stderr.WriteString(msg)
	os.Exit(1)
}

func runInit() error {
	f := os.NewFile(configFD, "config")
	var cfg initConfig
	if err := json.NewDecoder(f).Decode(&cfg); err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	f.Close()
	if err := becomeRoot(); err != nil {
		return err
	}
	if len(cfg.Mounts) == 0 || cfg.Mounts[0].Target != "/" {
		return errors.New("config: rootfs mount missing")
	}
	// The daemon has moved us into the sandbox's cgroups by now: a cgroup
	// namespace rooted here hides the host's hierarchy.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroupns: %w", err)
	}
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	if err := setupRoot(cfg); err != nil {
		return err
	}
	if err := dropPrivileges(); err != nil {
		return err
	}
	if err := tokenStdin(cfg.Token); err != nil {
		return err
	}
	env := runtime.DefaultEnv(cfg.Env)
	err := unix.Exec(runtime.AgentMountPath, []string{runtime.AgentMountPath, "agent"}, env)
	return fmt.Errorf("exec agent: %w", err)
}

// tokenStdin makes a pipe holding token, closed for writing, the standard
// input the agent will read its token from.
func tokenStdin(token string) error {
	r, err := runtime.TokenPipe(token)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := unix.Dup3(int(r.Fd()), 0, 0); err != nil {
		return fmt.Errorf("token stdin: %w", err)
	}
	return nil
}

// setupRoot makes the idmapped rootfs the root, with fresh /proc, a minimal
// /dev, read-only /sys and the daemon's bind mounts, and the host's tree
// detached.
func setupRoot(cfg initConfig) error {
	mounts := cfg.Mounts
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// proc must be made while the host's tree is still visible: the kernel
	// refuses proc in a user namespace unless a full proc is visible.
	proc, err := userns.NewFS("proc", nil, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(proc)
	// Attach the rootfs on a scratch tmpfs (a path init can reach without
	// host privileges), and pivot into it.
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700,size=4k"); err != nil {
		return fmt.Errorf("scratch tmpfs: %w", err)
	}
	if err := unix.Mkdir("/tmp/root", 0o700); err != nil {
		return fmt.Errorf("scratch dir: %w", err)
	}
	if err := userns.PivotInto(mounts[0].FD, "/tmp/root"); err != nil {
		return err
	}
	// From here every path resolves inside the sandbox's root.
	if err := userns.Attach(proc, "/proc", false); err != nil {
		return err
	}
	if err := userns.Attach(cfg.SysFD, "/sys", false); err != nil {
		return err
	}
	if cfg.CPUInfo != "" {
		if err := maskFile("/proc/cpuinfo", cfg.CPUInfo); err != nil {
			return err
		}
	}
	if err := setupDev(cfg.ShmBytes); err != nil {
		return err
	}
	for _, m := range mounts[1:] {
		if err := userns.Attach(m.FD, m.Target, m.File); err != nil {
			return err
		}
		unix.Close(m.FD)
	}
	return nil
}

// devBytes sizes the tmpfs /dev: it only holds directories and symlinks
// (device nodes are bind mounts), and anything written there is memory.
const devBytes = 1 << 20

// setupDev mounts a tmpfs /dev with pts, shm (of shmBytes) and the usual
// symlinks. Device nodes are bound from the host by the caller (mounts with
// /dev/ targets).
func setupDev(shmBytes int64) error {
	if err := userns.Ensure("/dev", false); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, fmt.Sprintf("mode=0755,size=%d", devBytes)); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range []string{"/dev/pts", "/dev/shm"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	if err := unix.Mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("mode=1777,size=%d", shmBytes)); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	links := [][2]string{
		{"pts/ptmx", "/dev/ptmx"}, {"/proc/self/fd", "/dev/fd"},
		{"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"},
		{"/proc/self/fd/2", "/dev/stderr"}, {"/proc/kcore", "/dev/core"},
	}
	for _, l := range links {
		if err := os.Symlink(l[0], l[1]); err != nil {
			return err
		}
	}
	return nil
}

// maskFile mounts a read-only file holding content over target (a file
// of the sandbox's /proc). The file lives on a tmpfs of its own, sized to
// it and charged to the sandbox, that is attached nowhere else: remounted
// writable from inside, it could hold nothing of the host's.
func maskFile(target, content string) error {
	fs, err := userns.NewFS("tmpfs", map[string]string{"size": strconv.Itoa(len(content) + 4096), "mode": "0755"},
		unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(fs)
	name := path.Base(target)
	fd, err := unix.Openat(fs, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return fmt.Errorf("mask %s: %w", target, err)
	}
	f := os.NewFile(uintptr(fd), name)
	_, err = f.WriteString(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("mask %s: %w", target, err)
	}
	file, err := unix.OpenTree(fs, name, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("mask %s: open_tree: %w", target, err)
	}
	defer unix.Close(file)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(file, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mask %s: mount_setattr: %w", target, err)
	}
	return userns.Attach(file, target, true)
}

package microvm

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// QEMU's jail. QEMU runs as root of a user namespace of its own whose ids
// are a host range of that VM's own (its id slot, see slots.go), so on the
// host it is an unprivileged uid no other process has, with no capability;
// it has new mount, pid, IPC, UTS, cgroup and network namespaces besides.
// The KVM probe's QEMU runs in the same jail. Before it
// execs QEMU, the jail (this binary again, as JailArg) pivots into an empty
// tmpfs that holds only what QEMU needs: the host's /usr read-only (QEMU,
// its libraries and firmware), /dev/null, /dev/urandom (and /dev/kvm on
// KVM), a /proc of its own pid namespace (its 9p backend changes modes and
// xattrs through /proc/self/fd) and the sandbox's 9p exports. Everything
// else it uses arrives as open fds from the daemon: the kernel, initramfs
// and console log (reopened through /proc/self/fd), the QMP socket (bound
// by the daemon, listened on by QEMU) and the tap device (opened by the
// daemon in the sandbox's netns). The state dir itself is not reachable.
//
// The 9p exports are mounts idmapped with the same mapping (see
// userns.IdmappedRoot), so root's files inside the guest land on disk owned
// by 0 and a guest's chown to uid N by N, as before. What QEMU's 9p
// passthrough needs of its capabilities (jailCaps) is all that is left in
// its bounding set; they act in its own user namespace only.

// JailArg is the first argument that makes a binary act as QEMU's jail (see
// Jail). The daemon's binary handles it as the hidden `cubicle vmjail`.
const JailArg = "vmjail"

// File descriptors handed to the jail by launch.
const (
	jailConfigFD = 3 // read: jailConfig as JSON
	firstJailFD  = 4 // then the detached mounts of jailConfig.Mounts, then QEMU's fds
)

// Paths inside the jail.
const (
	jailExports = "/export" // the 9p exports: root, m0, m1...
)

// jailCaps are the capabilities QEMU keeps (in its own user namespace):
// what 9p passthrough does for the guest's root — chown, access and
// change files whatever their owner and mode, keep setuid bits, write file
// capabilities.
var jailCaps = []int{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH,
	unix.CAP_FOWNER, unix.CAP_FSETID, unix.CAP_SETFCAP}

// jailMount is a detached mount the jail attaches at Target.
type jailMount struct {
	FD     int    `json:"fd"`
	Target string `json:"target"`
	File   bool   `json:"file,omitempty"`
}

// jailConfig is what launch tells the jail, over jailConfigFD.
type jailConfig struct {
	Mounts []jailMount `json:"mounts"`
	// Symlinks are [target, link] pairs: the host's merged-/usr links.
	Symlinks [][2]string `json:"symlinks"`
	Argv     []string    `json:"argv"`
}

// Jail is the entry point of QEMU's process before it becomes QEMU. Run it
// when os.Args[1] == JailArg, first thing in main (or TestMain); it never
// returns. Its errors go to QEMU's log (standard error).
func Jail() {
	goruntime.LockOSThread()
	err := runJail()
	fmt.Fprintf(os.Stderr, "vmjail: %v\n", err)
	os.Exit(1)
}

func runJail() error {
	f := os.NewFile(jailConfigFD, "config")
	var cfg jailConfig
	if err := json.NewDecoder(f).Decode(&cfg); err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	f.Close()
	if len(cfg.Argv) == 0 {
		return errors.New("config: no QEMU command")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// proc must be made while the host's tree is still visible (the
	// kernel refuses proc in a user namespace unless a full proc is).
	proc, err := userns.NewFS("proc", map[string]string{"subset": "pid"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return err
	}
	root, err := userns.NewFS("tmpfs", map[string]string{"mode": "0755", "size": "64k"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return err
	}
	if err := userns.PivotInto(root, "/tmp"); err != nil {
		return err
	}
	if err := userns.Attach(proc, "/proc", false); err != nil {
		return err
	}
	unix.Close(proc)
	for _, m := range cfg.Mounts {
		if err := userns.Attach(m.FD, m.Target, m.File); err != nil {
			return err
		}
		unix.Close(m.FD)
	}
	for _, l := range cfg.Symlinks {
		if err := os.Symlink(l[0], l[1]); err != nil {
			return fmt.Errorf("symlink %s: %w", l[1], err)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("read-only root: %w", err)
	}
	if err := dropBoundingCaps(jailCaps); err != nil {
		return err
	}
	err = unix.Exec(cfg.Argv[0], cfg.Argv, []string{})
	return fmt.Errorf("exec %s: %w", cfg.Argv[0], err)
}

// dropBoundingCaps removes every capability but keep from the bounding set,
// so that root's exec gets only those.
func dropBoundingCaps(keep []int) error {
	kept := map[int]bool{}
	for _, c := range keep {
		kept[c] = true
	}
	for c := 0; ; c++ {
		if kept[c] {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			if errors.Is(err, unix.EINVAL) {
				return nil // past the last capability
			}
			return fmt.Errorf("drop capability %d: %w", c, err)
		}
	}
}

// jailFiles are the fds the daemon hands the jail, in order from
// firstJailFD, and the mounts among them.
type jailFiles struct {
	files    []*os.File
	mounts   []jailMount
	symlinks [][2]string
}

// add appends an open fd and returns its number in the jail.
func (j *jailFiles) add(f *os.File) int {
	j.files = append(j.files, f)
	return firstJailFD + len(j.files) - 1
}

func (j *jailFiles) addMount(fd int, target string, file bool) {
	n := j.add(os.NewFile(uintptr(fd), target))
	j.mounts = append(j.mounts, jailMount{FD: n, Target: target, File: file})
}

// path is how QEMU names fd n: it reopens the file, with its own
// credentials.
func fdPath(n int) string { return fmt.Sprintf("/proc/self/fd/%d", n) }

func (j *jailFiles) close() {
	for _, f := range j.files {
		f.Close()
	}
}

// hostTree adds a read-only recursive clone of the host's path, mounted
// at the same path in the jail.
func (j *jailFiles) hostTree(path string, file bool, attrs uint64) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", path, err)
	}
	j.addMount(fd, path, file)
	attr := unix.MountAttr{Attr_set: attrs}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("mount_setattr %s: %w", path, err)
	}
	return nil
}

// systemDirs are the host's top-level dirs QEMU's binary and libraries
// may be in: bound read-only, or recreated as the symlinks (into /usr)
// they are on a merged-/usr system.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// jailDevices are the host device nodes QEMU may open (plus /dev/kvm on
// KVM).
var jailDevices = []string{"/dev/null", "/dev/urandom"}

// systemFiles adds the host's system dirs, the dynamic linker's cache and
// devices.
func (j *jailFiles) systemFiles(kvm bool) error {
	for _, p := range systemDirs {
		fi, err := os.Lstat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			j.symlinks = append(j.symlinks, [2]string{t, p})
			continue
		}
		if err := j.hostTree(p, false, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NODEV); err != nil {
			return err
		}
	}
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		if err := j.hostTree("/etc/ld.so.cache", true, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return err
		}
	}
	devs := jailDevices
	if kvm {
		devs = append(devs[:len(devs):len(devs)], "/dev/kvm")
	}
	for _, p := range devs {
		if err := j.hostTree(p, true, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC); err != nil {
			return err
		}
	}
	return nil
}

// exports adds the sandbox's rootfs and bind mounts as 9p exports,
// idmapped with usernsFD (whose root is host id hostID), and returns their
// paths in the jail.
func (j *jailFiles) exports(spec runtime.Spec, usernsFD, hostID int) (root string, mounts []string, err error) {
	fd, err := userns.IdmappedRoot(spec.RootFS, usernsFD, hostID)
	if err != nil {
		return "", nil, fmt.Errorf("rootfs: %w", err)
	}
	root = jailExports + "/root"
	j.addMount(fd, root, false)
	for i, m := range spec.Mounts {
		fd, err := userns.IdmapTree(m.Source, usernsFD)
		if err != nil {
			return "", nil, fmt.Errorf("mount %s: %w", m.Target, err)
		}
		p := fmt.Sprintf("%s/m%d", jailExports, i)
		j.addMount(fd, p, false)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if m.ReadOnly {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return "", nil, fmt.Errorf("mount_setattr %s: %w", m.Target, err)
		}
		mounts = append(mounts, p)
	}
	return root, mounts, nil
}

// jailQEMU is the QEMU binary's real path, which the jail must show: under
// /usr.
func jailQEMU(p string) (string, error) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("microvm: QEMU: %w", err)
	}
	if !strings.HasPrefix(real, "/usr/") {
		return "", fmt.Errorf("microvm: QEMU at %s: it must be installed under /usr, the host's only tree its jail shows", real)
	}
	return real, nil
}

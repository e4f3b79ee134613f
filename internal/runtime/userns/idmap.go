package userns

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Overlayfs cannot itself be idmapped (it lacks FS_ALLOW_IDMAP: mount_setattr
// returns EINVAL), and a bind of it is the same superblock. So IdmappedRoot
// builds the sandbox's own overlay over the same layers, with every layer
// idmapped (on-disk 0 ↔ the sandbox's root on the host), mounted with the
// mounter's fsuid set to the sandbox root so that overlayfs's own work-dir and
// copy-up operations also map. The result: image files owned by 0 appear owned
// by root inside, and files created inside land in the upper dir owned by 0,
// exactly as if the manager's overlay had been written by host root.
//
// The manager's overlay at spec.RootFS stays mounted on the same upper and
// work dirs. overlayfs warns about that ("upperdir is in-use") and leaves
// concurrent use through both mounts undefined, so the manager must read the
// upper dir (snapshots, diffs) rather than its own overlay while the sandbox
// runs. A RootFS that is not an overlay is idmapped directly.

// overlayLayers are the layer paths of an overlay mount.
type overlayLayers struct {
	lower []string
	upper string
	work  string
}

// IdmappedRoot returns a detached mount (an fd for move_mount) of rootfs in
// which ids are shifted by the user namespace usernsFD, whose root is host
// id hostRoot.
func IdmappedRoot(rootfs string, usernsFD, hostRoot int) (int, error) {
	layers, isOverlay, err := findOverlay(rootfs)
	if err != nil {
		return -1, err
	}
	if !isOverlay {
		return IdmapTree(rootfs, usernsFD)
	}
	return idmappedOverlay(layers, usernsFD, hostRoot)
}

// IdmapTree clones the mount at path and idmaps the clone.
func IdmapTree(path string, usernsFD int) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", path, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(usernsFD)}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("idmap %s: %w", path, err)
	}
	return fd, nil
}

// idmappedOverlay mounts a new overlay over idmapped layers and returns its
// detached mount fd.
func idmappedOverlay(l overlayLayers, usernsFD, hostRoot int) (int, error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	var lowers []int
	for _, p := range l.lower {
		fd, err := IdmapTree(p, usernsFD)
		if err != nil {
			return -1, err
		}
		fds = append(fds, fd)
		lowers = append(lowers, fd)
	}
	// upper and work must be on one vfsmount: idmap their common parent.
	parent := filepath.Dir(l.upper)
	if filepath.Dir(l.work) != parent {
		return -1, fmt.Errorf("overlay upper %s and work %s are not siblings", l.upper, l.work)
	}
	pfd, err := IdmapTree(parent, usernsFD)
	if err != nil {
		return -1, err
	}
	fds = append(fds, pfd)
	upper, err := unix.Openat(pfd, filepath.Base(l.upper), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open upper: %w", err)
	}
	fds = append(fds, upper)
	work, err := unix.Openat(pfd, filepath.Base(l.work), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open work: %w", err)
	}
	fds = append(fds, work)

	// overlayfs records the mounter's credentials and uses them for its own
	// operations on the layers, so mount with fsuid/fsgid = sandbox root (the
	// only ids an idmapped layer can represent) and all capabilities
	// effective. Credentials are per thread: do it on a throwaway thread.
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		fd, err := mountOverlayAs(lowers, upper, work, hostRoot)
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

func mountOverlayAs(lowers []int, upper, work int, id int) (int, error) {
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(id), 0, 0); e != 0 {
		return -1, e
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(id), 0, 0); e != 0 {
		return -1, e
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return -1, fmt.Errorf("capget: %w", err)
	}
	data[0].Effective, data[1].Effective = data[0].Permitted, data[1].Permitted
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return -1, fmt.Errorf("capset: %w", err)
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	for _, fd := range lowers {
		if err := unix.FsconfigSetFd(fsfd, "lowerdir+", fd); err != nil {
			return -1, fmt.Errorf("overlay lowerdir+: %w", err)
		}
	}
	if err := unix.FsconfigSetFd(fsfd, "upperdir", upper); err != nil {
		return -1, fmt.Errorf("overlay upperdir: %w", err)
	}
	if err := unix.FsconfigSetFd(fsfd, "workdir", work); err != nil {
		return -1, fmt.Errorf("overlay workdir: %w", err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("overlay create: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount overlay: %w", err)
	}
	return mfd, nil
}

// findOverlay looks up the topmost mount at path in /proc/self/mountinfo and,
// when it is an overlay, returns its layers.
func findOverlay(path string) (overlayLayers, bool, error) {
	path, err := filepath.EvalSymlinks(path)
	if err != nil {
		return overlayLayers{}, false, fmt.Errorf("resolve rootfs: %w", err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return overlayLayers{}, false, err
	}
	defer f.Close()
	var fstype, opts string
	found := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields := strings.Fields(pre)
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != path {
			continue
		}
		p := strings.Fields(post)
		if len(p) < 3 {
			continue
		}
		fstype, opts, found = p[0], p[2], true // keep the last (topmost) one
	}
	if err := sc.Err(); err != nil {
		return overlayLayers{}, false, fmt.Errorf("read mountinfo: %w", err)
	}
	if !found {
		return overlayLayers{}, false, fmt.Errorf("rootfs %s is not a mount point", path)
	}
	if fstype != "overlay" {
		return overlayLayers{}, false, nil
	}
	l, err := parseOverlayOpts(opts)
	return l, err == nil, err
}

// parseOverlayOpts extracts layers from overlay super options as shown in
// mountinfo: "lowerdir=/a:/b" or repeated "lowerdir+=/a", with ',' ':' and
// '\' escaped by a backslash and whitespace escaped as octal.
func parseOverlayOpts(opts string) (overlayLayers, error) {
	var l overlayLayers
	for _, opt := range splitEscaped(opts, ',') {
		k, v, _ := strings.Cut(opt, "=")
		switch k {
		case "lowerdir":
			for _, p := range splitEscaped(v, ':') {
				l.lower = append(l.lower, unescapeOverlay(p))
			}
		case "lowerdir+":
			l.lower = append(l.lower, unescapeOverlay(v))
		case "upperdir":
			l.upper = unescapeOverlay(v)
		case "workdir":
			l.work = unescapeOverlay(v)
		case "datadir+":
			return l, fmt.Errorf("overlay data-only layers are not supported")
		}
	}
	if len(l.lower) == 0 || l.upper == "" || l.work == "" {
		return l, fmt.Errorf("overlay without lower/upper/work dirs (%q): read-only rootfs is not supported", opts)
	}
	return l, nil
}

// splitEscaped splits s at sep characters not preceded by a backslash.
func splitEscaped(s string, sep byte) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func unescapeOverlay(s string) string {
	s = unescapeMountinfo(s)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unescapeMountinfo undoes the kernel's octal escaping of " \t\n\\".
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// New starts argv (a command that blocks reading fd 3 until EOF, and is
// killed here) in a fresh user namespace with the sandbox id mapping at
// base (see IDMap) and returns an fd of that namespace. Idmapped mounts
// take their mapping from it; the namespace outlives the process.
func New(argv []string, base int) (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer r.Close()
	defer w.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return -1, err
	}
	defer null.Close()
	attr := &syscall.ProcAttr{
		Files: []uintptr{null.Fd(), null.Fd(), null.Fd(), r.Fd()},
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER,
			UidMappings: IDMap(base),
			GidMappings: IDMap(base),
			Pdeathsig:   syscall.SIGKILL,
		},
	}
	pid, err := syscall.ForkExec(argv[0], argv, attr)
	if err != nil {
		return -1, fmt.Errorf("start userns holder: %w", err)
	}
	defer func() {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
	}()
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open userns: %w", err)
	}
	return fd, nil
}

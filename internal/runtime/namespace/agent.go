package namespace

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// agentFS is a detached, read-only tmpfs holding a copy of the agent binary,
// which every sandbox gets a clone of at runtime.AgentMountPath. A bind of
// the host file would show the file's host path (the daemon's install or
// data dir) as the mount's root in the sandbox's /proc/self/mountinfo; in
// the tmpfs it is just "/cubicle". One copy serves all sandboxes; it is
// made again when the source file changes (a new daemon binary).
type agentFS struct {
	fd  int         // detached mount, -1 before the first sandbox
	src string      // the copied file
	key unix.Stat_t // src's identity and mtime when copied
}

const agentFSName = "cubicle"

// agentTree returns a detached read-only mount of the agent binary at src,
// from d's copy.
func (d *Driver) agentTree(src string) (int, error) {
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return -1, fmt.Errorf("agent binary: %w", err)
	}
	a := &d.agent
	if a.fd < 0 || a.src != src || a.key.Dev != st.Dev || a.key.Ino != st.Ino ||
		a.key.Size != st.Size || a.key.Mtim != st.Mtim {
		fd, err := copyToTmpfs(src, st.Size)
		if err != nil {
			return -1, fmt.Errorf("copy agent binary: %w", err)
		}
		if a.fd >= 0 {
			unix.Close(a.fd) // sandboxes keep their clones
		}
		*a = agentFS{fd: fd, src: src, key: st}
	}
	fd, err := unix.OpenTree(a.fd, agentFSName, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("clone agent binary: %w", err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("agent binary mount attributes: %w", err)
	}
	return fd, nil
}

// copyToTmpfs makes a detached tmpfs just big enough for src, copies src
// into it as agentFSName (mode 0555) and makes the mount read-only.
func copyToTmpfs(src string, size int64) (int, error) {
	in, err := os.Open(src)
	if err != nil {
		return -1, err
	}
	defer in.Close()
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "size", strconv.FormatInt(size+1<<20, 10)); err != nil {
		return -1, fmt.Errorf("tmpfs size: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create tmpfs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount tmpfs: %w", err)
	}
	fail := func(err error) (int, error) {
		unix.Close(mnt)
		return -1, err
	}
	ofd, err := unix.Openat(mnt, agentFSName, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o555)
	if err != nil {
		return fail(err)
	}
	out := os.NewFile(uintptr(ofd), agentFSName)
	_, err = io.Copy(out, in)
	if err = errors.Join(err, out.Close()); err != nil {
		return fail(err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(mnt, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fail(fmt.Errorf("make agent tmpfs read-only: %w", err))
	}
	return mnt, nil
}

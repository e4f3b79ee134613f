package namespace

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// fdMount tells init to attach the detached mount it received as fd FD at
// Target (a path inside the sandbox). The rootfs is always first, at "/".
type fdMount struct {
	FD     int    `json:"fd"`
	Target string `json:"target"`
	File   bool   `json:"file,omitempty"` // mount point is a file, not a dir
}

// detachedMounts are mounts the daemon prepares for init as detached mount
// fds (open_tree/fsmount), so that init — unprivileged on the host — never
// has to traverse host paths such as the daemon's private state dir.
type detachedMounts struct {
	files   []*os.File
	targets []fdMount
}

func (m *detachedMounts) add(fd int, target string, file bool) {
	m.targets = append(m.targets, fdMount{FD: firstMountFD + len(m.files), Target: target, File: file})
	m.files = append(m.files, os.NewFile(uintptr(fd), target))
}

func (m *detachedMounts) close() {
	for _, f := range m.files {
		f.Close()
	}
}

// hostDevices are bound from the host into the sandbox's tmpfs /dev; a user
// namespace may not mknod.
var hostDevices = [...]string{"null", "zero", "full", "random", "urandom", "tty"}

// hostMounts builds every detached mount init needs: the idmapped rootfs,
// the agent binary (read-only, from d's copy), spec's binds (idmapped like
// the rootfs) and the device nodes.
// resolv.conf and hosts are files of the rootfs (runtime.WriteNetFiles), not
// host files: bound in, they let the sandbox write past its quota onto the
// host's disk.
func (d *Driver) hostMounts(spec runtime.Spec, usernsFD int) (*detachedMounts, error) {
	m := &detachedMounts{}
	root, err := userns.IdmappedRoot(spec.RootFS, usernsFD, userns.HostIDBase)
	if err != nil {
		return m, fmt.Errorf("rootfs: %w", err)
	}
	m.add(root, "/", false)
	agent, err := d.agentTree(spec.AgentBinary)
	if err != nil {
		return m, err
	}
	m.add(agent, runtime.AgentMountPath, true)
	for _, bind := range spec.Mounts {
		fd, err := userns.IdmapTree(bind.Source, usernsFD)
		if err != nil {
			return m, err
		}
		m.add(fd, bind.Target, false)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if bind.ReadOnly {
			attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return m, fmt.Errorf("mount_setattr %s: %w", bind.Target, err)
		}
	}
	for _, dev := range hostDevices {
		src := "/dev/" + dev
		fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return m, fmt.Errorf("open_tree %s: %w", src, err)
		}
		m.add(fd, src, true)
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return m, fmt.Errorf("mount_setattr %s: %w", src, err)
		}
	}
	return m, nil
}

package network

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ensureNetNSDir creates dir and makes it a shared mount point, as iproute2
// does for /run/netns: unmounting a netns file then propagates into mount
// namespaces created after the bind mount (a sandbox runtime's, say), so the
// namespace is not pinned by a stale copy of the mount.
func ensureNetNSDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	// Not a mount point yet: bind it onto itself, then retry.
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// isNetNS reports whether path is a mounted network namespace (nsfs).
func isNetNS(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// createNetNS creates a fresh network namespace and bind-mounts it on path.
// It is a no-op if path already holds one. The work happens on a dedicated,
// locked OS thread so that no goroutine of the caller ever runs in the new
// namespace; if the thread cannot return to its original namespace it is
// left locked and the Go runtime discards it when the goroutine exits.
func createNetNS(path string) error {
	if isNetNS(path) {
		return nil
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return fmt.Errorf("create netns file: %w", err)
	}
	f.Close()

	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- unshareAndMount(path)
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// unshareAndMount runs on a locked thread. It unlocks the thread only when
// the thread is back in its original namespace.
func unshareAndMount(path string) error {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("open current netns: %w", err)
	}
	defer orig.Close()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("unshare netns: %w", err)
	}
	src := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
	merr := unix.Mount(src, path, "none", unix.MS_BIND, "")
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Stay locked: this thread is unusable and dies with the goroutine.
		return errors.Join(merr, fmt.Errorf("restore netns: %w", err))
	}
	runtime.UnlockOSThread()
	if merr != nil {
		return fmt.Errorf("bind-mount netns on %s: %w", path, merr)
	}
	return nil
}

// deleteNetNS unmounts and removes path. Missing or unmounted paths are fine.
// The namespace itself goes away when nothing else holds it.
func deleteNetNS(path string) error {
	if isNetNS(path) {
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount netns %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove netns file: %w", err)
	}
	return nil
}

// enableForwarding turns on IPv4 forwarding in the root namespace; sandbox
// egress is routed through the host.
func enableForwarding() error {
	return writeSysctl("/proc/sys/net/ipv4/ip_forward", "1")
}

// writeSysctl writes val to a /proc/sys file unless it already holds val.
func writeSysctl(path, val string) error {
	cur, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(cur)) == val {
		return nil
	}
	return os.WriteFile(path, []byte(val+"\n"), 0o644)
}

// NSHandle opens a netlink handle inside the netns at path (bind-mounted
// nsfs file); done closes both. Runtime drivers use it on the sandbox's
// netns the manager handed them.
func NSHandle(path string) (h *netlink.Handle, done func(), err error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, nil, fmt.Errorf("open netns %s: %w", path, err)
	}
	h, err = netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, nil, fmt.Errorf("netlink in %s: %w", path, err)
	}
	return h, func() { h.Close(); ns.Close() }, nil
}

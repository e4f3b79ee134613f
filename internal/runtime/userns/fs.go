package userns

import (
	"fmt"
	"os"
	"path"

	"golang.org/x/sys/unix"
)

// NewFS creates a detached mount of a fresh filesystem configured with
// config (e.g. source, size).
func NewFS(fstype string, config map[string]string, attrs int) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for k, v := range config {
		if err := unix.FsconfigSetString(fs, k, v); err != nil {
			return -1, fmt.Errorf("%s %s: %w", fstype, k, err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create %s: %w", fstype, err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return fd, nil
}

// Attach moves the detached mount fd onto target, creating the mount point.
func Attach(fd int, target string, file bool) error {
	if err := Ensure(target, file); err != nil {
		return err
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount %s: %w", target, err)
	}
	return nil
}

// Ensure creates a mount point (and its parents) when missing. A dangling
// symlink (e.g. /etc/resolv.conf → a systemd runtime file) is replaced.
// In a sandbox root these writes land in its upper dir, never in image
// layers.
func Ensure(p string, file bool) error {
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
	}
	dir := p
	if file {
		dir = path.Dir(p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", p, err)
	}
	if file {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return fmt.Errorf("mount point %s: %w", p, err)
		}
		f.Close()
	}
	return nil
}

// PivotInto attaches the detached mount fd at dir (an existing directory),
// closes fd and makes the mount the process's root: pivot_root(".", ".")
// stacks the old root on the new one, and detaching it leaves the host's
// tree unreachable (no put_old directory is needed in the new root).
func PivotInto(fd int, dir string) error {
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach new root: %w", err)
	}
	unix.Close(fd)
	if err := unix.Chdir(dir); err != nil {
		return fmt.Errorf("chdir new root: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

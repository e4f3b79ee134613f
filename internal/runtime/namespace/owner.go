package namespace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// Each running sandbox's user namespace is created by a host uid of its own
// from [ownerIDBase, ownerIDBase+ownerIDCount), an id no login user has.
// The kernel charges per-user counts (inotify instances and watches,
// fanotify groups, user namespaces, queued signals, POSIX message queues,
// locked memory) at every level up to the host's namespace, where the
// charge lands on the namespace's owner. Owned by host root, as before, a
// sandbox could exhaust root's share (max_user_instances is 128 inotify
// instances) and host services and every other sandbox got EMFILE; owned by
// its own uid, it exhausts only its own.
const (
	ownerIDBase  = 1_100_000
	ownerIDCount = 100_000
	ownerFile    = "owner" // in stateDir/<id>/: the sandbox's owner uid
)

// allocOwner picks the lowest owner uid no other sandbox in stateDir holds
// and records it in stateDir/<id>/owner. Owners are released with the state
// dir in Stop.
func (d *Driver) allocOwner(id string) (int, error) {
	d.ownersMu.Lock()
	defer d.ownersMu.Unlock()
	entries, err := os.ReadDir(d.stateDir)
	if err != nil {
		return 0, fmt.Errorf("list sandboxes: %w", err)
	}
	used := map[int]bool{}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.stateDir, e.Name(), ownerFile))
		if errors.Is(err, os.ErrNotExist) {
			continue // starting before allocOwner, or started by an older daemon
		}
		if err != nil {
			return 0, fmt.Errorf("read owner of %s: %w", e.Name(), err)
		}
		if uid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			used[uid] = true
		}
	}
	for uid := ownerIDBase; uid < ownerIDBase+ownerIDCount; uid++ {
		if used[uid] {
			continue
		}
		if err := os.WriteFile(filepath.Join(d.dir(id), ownerFile), []byte(strconv.Itoa(uid)), 0o600); err != nil {
			return 0, fmt.Errorf("record owner: %w", err)
		}
		return uid, nil
	}
	return 0, fmt.Errorf("all %d sandbox owner ids are in use: %w", ownerIDCount, errdefs.ErrUnavailable)
}

// startAs runs start (a fork of a process that creates its user namespace)
// with the calling thread's effective uid and gid set to owner, so that the
// new namespace is owned by owner. Real and saved ids stay 0, so the thread
// becomes root again afterwards; capabilities are back with euid 0. The
// caller must hold the thread locked. On a failed restore the thread stays
// locked and is discarded with its goroutine; ok reports whether the thread
// may be reused.
func startAs(owner int, start func() error) (ok bool, err error) {
	restore := func() error {
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			return fmt.Errorf("restore euid: %w", e)
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			return fmt.Errorf("restore egid: %w", e)
		}
		return nil
	}
	// Per thread, not the all-threads wrappers of package unix.
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(owner), ^uintptr(0)); e != 0 {
		return true, fmt.Errorf("set egid %d: %w", owner, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(owner), ^uintptr(0)); e != 0 {
		if err := restore(); err != nil {
			return false, err
		}
		return true, fmt.Errorf("set euid %d: %w", owner, e)
	}
	startErr := start()
	if err := restore(); err != nil {
		return false, err
	}
	return true, startErr
}

// writeIDMaps writes the sandbox id mapping (userns.IDMap) in the user
// namespace of pid. The daemon writes them, not the child, because the
// namespace's owner has no capability over the host's ids.
func writeIDMaps(pid int) error {
	m := fmt.Sprintf("0 %d %d\n", userns.HostIDBase, userns.IDMapSize)
	for _, f := range []string{"uid_map", "gid_map"} {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(m), 0); err != nil {
			return fmt.Errorf("write %s: %w", f, err)
		}
	}
	return nil
}

// becomeRoot makes init root of its user namespace once the daemon has
// written the id maps. Init was exec'd as the unmapped owner with every
// capability ambient; as root, it keeps them in its effective set.
func becomeRoot() error {
	if err := unix.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := unix.Setresgid(0, 0, 0); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := unix.Setresuid(0, 0, 0); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	return nil
}

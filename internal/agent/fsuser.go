package agent

import (
	"errors"
	"fmt"
	"path"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File operations the API asks for (read, write, stat, glob, grep) act as
// the sandbox's run_config.user, not as the agent's root: a user's
// symlink or directory must not let an API upload overwrite /etc/shadow.
// Two rules do it:
//
//   - Credentials. asUser runs the operation on a locked OS thread whose
//     effective uid, gid and groups are the user's. A non-zero euid has no
//     effective capabilities (no CAP_DAC_OVERRIDE, CAP_FOWNER, ...), so the
//     kernel checks every lookup, open, mkdir and rename as that user's.
//     gVisor has no setfsuid (ENOSYS), so it is setresuid with the saved
//     uid kept at 0 to switch back; both kernels clear the effective
//     capabilities when the euid leaves 0 and restore them when it returns.
//   - Symlinks. lookup resolves paths itself, one component at a time with
//     O_NOFOLLOW, and follows a symlink the user could have planted (owned by
//     the user, or in a directory the user owns) only if it stays inside the
//     run of user-owned directories it sits in: /home/u/x → /etc/shadow, or
//     a user's link in /tmp, is refused with errSymlinkEscape.
//
// For root (no user, or uid 0) operations keep the agent's credentials and
// follow symlinks like the kernel.

// errSymlinkEscape is a path through a user-controlled symlink that leaves
// the directories its user owns.
var errSymlinkEscape = errors.New("path follows a symlink out of the directories its user owns")

// maxSymlinks bounds the symlinks one lookup expands, as the kernel's 40.
const maxSymlinks = 40

// actsAsRoot reports whether file operations for id keep the agent's own
// credentials.
func (id identity) actsAsRoot() bool { return !id.change || id.uid == 0 }

// asUser runs fn with id's credentials on fn's own OS thread (see above).
// Go starts new threads from a clean template thread while this one is
// locked, so no other goroutine ever runs with id's credentials. If the
// agent's credentials cannot be restored the thread stays locked and Go
// discards it when the goroutine ends.
func asUser(id identity, fn func() error) error {
	if id.actsAsRoot() {
		return fn()
	}
	runtime.LockOSThread()
	saved, err := threadCreds()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	if err = setThreadCreds(id.uid, id.gid, id.groups); err != nil {
		err = fmt.Errorf("act as uid %d: %w", id.uid, err)
	} else {
		err = fn()
	}
	if rerr := saved.restore(); rerr != nil {
		return errors.Join(err, rerr) // the thread stays locked: discarded
	}
	runtime.UnlockOSThread()
	return err
}

// creds are a thread's effective ids and groups.
type creds struct {
	uid, gid uint32
	groups   []uint32
}

func threadCreds() (creds, error) {
	gs, err := unix.Getgroups()
	if err != nil {
		return creds{}, fmt.Errorf("getgroups: %w", err)
	}
	c := creds{uid: uint32(unix.Geteuid()), gid: uint32(unix.Getegid())}
	for _, g := range gs {
		c.groups = append(c.groups, uint32(g))
	}
	return c, nil
}

// restore switches the thread back to c: the uid first, which brings the
// capabilities back that setting the gid and groups needs.
func (c creds) restore() error {
	if err := setres(unix.SYS_SETRESUID, c.uid); err != nil {
		return fmt.Errorf("restore uid: %w", err)
	}
	if err := setres(unix.SYS_SETRESGID, c.gid); err != nil {
		return fmt.Errorf("restore gid: %w", err)
	}
	if err := setgroups(c.groups); err != nil {
		return fmt.Errorf("restore groups: %w", err)
	}
	return nil
}

// setThreadCreds sets the calling thread's groups, egid and euid (in that
// order: the last drops the capabilities the others need). The raw system
// calls affect this thread only; the syscall package's wrappers would
// change every thread of the agent.
func setThreadCreds(uid, gid uint32, groups []uint32) error {
	if err := setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := setres(unix.SYS_SETRESGID, gid); err != nil {
		return fmt.Errorf("setresgid: %w", err)
	}
	if err := setres(unix.SYS_SETRESUID, uid); err != nil {
		return fmt.Errorf("setresuid: %w", err)
	}
	return nil
}

// setres sets only the effective id (real and saved stay, so root can come
// back) with setresuid or setresgid.
func setres(trap uintptr, id uint32) error {
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(trap, keep, uintptr(id), keep); e != 0 {
		return e
	}
	return nil
}

func setgroups(gs []uint32) error {
	var p unsafe.Pointer
	if len(gs) > 0 {
		p = unsafe.Pointer(&gs[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gs)), uintptr(p), 0); e != 0 {
		return e
	}
	return nil
}

// resolved is a looked-up path: the directory holding its last component
// (an O_PATH descriptor the caller closes) and that component's name.
type resolved struct {
	dir  int
	name string
	path string // the real path, for messages
}

func (r resolved) close() { unix.Close(r.dir) }

// lookupOpts say how lookup treats the path's ends.
type lookupOpts struct {
	followLast bool // resolve a final symlink (reads); writes replace it
	mkdirs     bool // create missing directories (0755) on the way
}

// dirEnt is one directory on the path walked so far.
type dirEnt struct {
	fd    int
	name  string
	owned bool // owned by the user the lookup is for
}

// walker is the state of one lookup for uid (0: root, symlinks unchecked).
type walker struct {
	uid   uint32
	stack []dirEnt // stack[0] is "/"; the last entry is the current dir
	// beneath is the stack depth the lookup may not leave once it has
	// followed a user-controlled symlink (0: unconstrained).
	beneath int
	links   int
}

// lookup resolves the absolute path p component by component, as the
// calling thread's credentials (run it inside asUser), applying the
// symlink rule for uid unless uid is 0. The empty path and "/" give "/" and
// name ".".
func lookup(uid uint32, p string, o lookupOpts) (resolved, error) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return resolved{}, fmt.Errorf("open /: %w", err)
	}
	w := &walker{uid: uid, stack: []dirEnt{{fd: root, name: ""}}}
	var st unix.Stat_t
	if unix.Fstat(root, &st) == nil {
		w.stack[0].owned = st.Uid == uid
	}
	r, err := w.walk(splitPath(p), o)
	for i, d := range w.stack {
		if err != nil || i != len(w.stack)-1 {
			unix.Close(d.fd)
		}
	}
	if err != nil {
		return resolved{}, fmt.Errorf("%s: %w", p, err)
	}
	return r, nil
}

func splitPath(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// dirPath is the real path of the current directory.
func (w *walker) dirPath() string {
	names := make([]string, len(w.stack))
	for i, d := range w.stack {
		names[i] = d.name
	}
	return "/" + path.Join(names...)
}

func (w *walker) walk(rest []string, o lookupOpts) (resolved, error) {
	for {
		if len(rest) == 0 {
			return w.result("."), nil
		}
		c := rest[0]
		rest = rest[1:]
		top := w.stack[len(w.stack)-1]
		if c == ".." {
			if len(w.stack)-1 <= w.beneath && w.beneath > 0 {
				return resolved{}, errSymlinkEscape
			}
			if len(w.stack) > 1 {
				unix.Close(top.fd)
				w.stack = w.stack[:len(w.stack)-1]
			}
			continue
		}
		last := len(rest) == 0
		var st unix.Stat_t
		err := unix.Fstatat(top.fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.ENOENT) && o.mkdirs && !last {
			if err = unix.Mkdirat(top.fd, c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				err = unix.Fstatat(top.fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
			}
		}
		if errors.Is(err, unix.ENOENT) && last {
			return w.result(c), nil // the caller creates it or reports it missing
		}
		if err != nil {
			return resolved{}, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK && (!last || o.followLast) {
			more, err := w.follow(top, c, &st)
			if err != nil {
				return resolved{}, err
			}
			rest = append(more, rest...)
			continue
		}
		if last {
			return w.result(c), nil
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return resolved{}, unix.ENOTDIR
		}
		fd, err := unix.Openat(top.fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return resolved{}, err
		}
		// Ownership from the opened directory itself, not the earlier stat,
		// so a swap in between cannot fake it.
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return resolved{}, err
		}
		w.stack = append(w.stack, dirEnt{fd: fd, name: c, owned: st.Uid == w.uid})
	}
}

// result is name in the current directory; the stack's top descriptor is
// handed to the caller.
func (w *walker) result(name string) resolved {
	top := w.stack[len(w.stack)-1]
	return resolved{dir: top.fd, name: name, path: path.Join(w.dirPath(), name)}
}

// follow reads the symlink name in dir and returns the components to walk
// instead, moving the walk to "/" (or the confining directory) for an
// absolute target. A user-controlled link (owned by the user, or in a
// directory the user owns) confines the rest of the walk to the run of
// user-owned directories holding it.
func (w *walker) follow(dir dirEnt, name string, st *unix.Stat_t) ([]string, error) {
	if w.links++; w.links > maxSymlinks {
		return nil, unix.ELOOP
	}
	target, err := readlinkat(dir.fd, name)
	if err != nil {
		return nil, err
	}
	if w.uid != 0 && (st.Uid == w.uid || dir.owned) {
		if !dir.owned {
			return nil, errSymlinkEscape // e.g. the user's link in /tmp
		}
		top := len(w.stack) - 1
		for top > 0 && w.stack[top-1].owned {
			top--
		}
		w.beneath = max(w.beneath, top)
	}
	if !strings.HasPrefix(target, "/") {
		return splitPath(target), nil
	}
	// An absolute target restarts at "/", or under a confinement at the
	// confining directory, which the target must name without "..".
	base := 0
	comps := splitPath(target)
	if w.beneath > 0 {
		for i := 1; i <= w.beneath; i++ {
			if len(comps) < i || comps[i-1] != w.stack[i].name {
				return nil, errSymlinkEscape
			}
		}
		for _, c := range comps {
			if c == ".." {
				return nil, errSymlinkEscape
			}
		}
		base, comps = w.beneath, comps[w.beneath:]
	}
	for _, d := range w.stack[base+1:] {
		unix.Close(d.fd)
	}
	w.stack = w.stack[:base+1]
	return comps, nil
}

func readlinkat(dirfd int, name string) (string, error) {
	for n := 256; n <= 1<<16; n *= 4 {
		buf := make([]byte, n)
		m, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if m < n {
			return string(buf[:m]), nil
		}
	}
	return "", unix.ENAMETOOLONG
}

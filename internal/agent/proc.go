package agent

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// procSpec describes one command to start as `<shell> -c <command>`.
type procSpec struct {
	shell, command string
	env            []string
	dir            string
	id             identity
	pty            bool
	rows, cols     uint16
	// stdinPipe gives the command a pipe for stdin; otherwise stdin is
	// /dev/null. Ignored under a PTY, whose stdin is the terminal.
	stdinPipe bool
}

// proc is a started command. Its pid is also its process group id, so
// killing -pid reaches every process it spawned that stayed in the group.
type proc struct {
	pid    int
	exited <-chan syscall.WaitStatus
	// out holds the parent's read ends: stdout and stderr, or for a PTY the
	// master in out[0] and nil in out[1]. All are non-blocking (pollable), so
	// closing one unblocks a pending Read.
	out [2]*os.File
	// stdin is the pipe's write end or the PTY master; nil for /dev/null.
	stdin *os.File
	pty   *os.File
}

// spawn starts spec in its own process group (its own session under a PTY)
// through the reaper, which alone will collect its exit status.
func spawn(r *reaper, spec procSpec) (*proc, error) {
	p := &proc{}
	var child []*os.File // the child's ends, closed in the parent after fork
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	fail := func(err error) (*proc, error) {
		p.closeAll()
		return nil, err
	}
	sys := &syscall.SysProcAttr{}
	if spec.id.change {
		sys.Credential = &syscall.Credential{Uid: spec.id.uid, Gid: spec.id.gid, Groups: spec.id.groups}
	}
	var files []uintptr
	if spec.pty {
		master, slave, err := openPTY(spec.rows, spec.cols)
		if err != nil {
			return fail(err)
		}
		child = append(child, slave)
		p.pty, p.stdin, p.out[0] = master, master, master
		fd := slave.Fd()
		files = []uintptr{fd, fd, fd}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		var stdin *os.File
		if spec.stdinPipe {
			r, w, err := os.Pipe()
			if err != nil {
				return fail(fmt.Errorf("stdin pipe: %w", err))
			}
			stdin, p.stdin = r, w
		} else {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return fail(fmt.Errorf("open %s: %w", os.DevNull, err))
			}
			stdin = f
		}
		child = append(child, stdin)
		files = append(files, stdin.Fd())
		for i := range p.out {
			r, w, err := os.Pipe()
			if err != nil {
				return fail(fmt.Errorf("output pipe: %w", err))
			}
			p.out[i] = r
			child = append(child, w)
			files = append(files, w.Fd())
		}
		sys.Setpgid = true
	}
	attr := &syscall.ProcAttr{Dir: spec.dir, Env: spec.env, Files: files, Sys: sys}
	argv := []string{spec.shell, "-c", spec.command}
	pid, exited, err := r.start(func() (int, error) { return syscall.ForkExec(spec.shell, argv, attr) })
	if errors.Is(err, syscall.EAGAIN) {
		return fail(fmt.Errorf("start %s: the sandbox is at its limit of processes and threads (one per MiB of mem_bytes, at most the daemon's pids limit), e.g. after a fork bomb: wait for processes to exit or kill some: %w", spec.shell, err))
	}
	if err != nil {
		return fail(fmt.Errorf("start %s: %w", spec.shell, err))
	}
	p.pid, p.exited = pid, exited
	return p, nil
}

// closeAll closes every parent-side descriptor of p.
func (p *proc) closeAll() {
	seen := map[*os.File]bool{}
	for _, f := range []*os.File{p.out[0], p.out[1], p.stdin, p.pty} {
		if f != nil && !seen[f] {
			seen[f] = true
			f.Close()
		}
	}
}

// openPTY allocates a pseudo-terminal of the given size. It is done with raw
// ioctls rather than creack/pty because that package calls File.Fd on the
// master, which switches it to blocking mode; a blocking master cannot be
// unblocked by Close when a background process keeps the terminal open.
func openPTY(rows, cols uint16) (master, slave *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	master = os.NewFile(uintptr(fd), "/dev/ptmx")
	n, err := unix.IoctlGetUint32(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	}
	if err == nil {
		err = unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("set up pty: %w", err)
	}
	name := fmt.Sprintf("/dev/pts/%d", n)
	slave, err = os.OpenFile(name, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	return master, slave, nil
}

// setWinsize resizes the terminal whose master is f.
func setWinsize(f *os.File, rows, cols uint16) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	var ierr error
	if err := sc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return fmt.Errorf("resize pty: %w", err)
	}
	if ierr != nil {
		return fmt.Errorf("resize pty: %w", ierr)
	}
	return nil
}

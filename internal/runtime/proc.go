package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Process is a host process a driver started and records in its state:
// StartTime (field 22 of /proc/<pid>/stat) pins PID to that very process,
// so a recycled pid is never taken for it.
type Process struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// ProcessOf returns the Process now running as pid.
func ProcessOf(pid int) (Process, error) {
	start, _, err := procStat(pid)
	if err != nil {
		return Process{}, fmt.Errorf("process %d: %w", pid, err)
	}
	return Process{PID: pid, StartTime: start}, nil
}

// Alive reports whether p exists, is not a zombie and is the one that was
// started.
func (p Process) Alive() bool {
	start, zombie, err := procStat(p.PID)
	return err == nil && !zombie && start == p.StartTime
}

// Kill SIGKILLs p through a pidfd (opened first, then checked against the
// start time, so a recycled pid is never signalled) and waits until it has
// exited. A process that is gone already is not an error.
func (p Process) Kill(ctx context.Context) error {
	pidfd, err := unix.PidfdOpen(p.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	if start, _, err := procStat(p.PID); err != nil || start != p.StartTime {
		return nil // gone, or a different process now
	}
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("kill: %w", err)
	}
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 50)
		if n > 0 {
			return nil
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for exit: %w", err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("wait for exit: %w", ctx.Err())
		}
	}
}

// procStat returns field 22 (start time) of /proc/<pid>/stat and whether
// the process is a zombie.
func procStat(pid int) (uint64, bool, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false, err
	}
	// comm (field 2) may contain spaces and parentheses: parse after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	// f[0] is field 3 (state); field 22 is f[19].
	start, err := strconv.ParseUint(f[19], 10, 64)
	return start, f[0] == "Z" || f[0] == "X", err
}

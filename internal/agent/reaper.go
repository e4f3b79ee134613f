package agent

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper owns every wait on the agent's child processes, so that no exit
// status is ever stolen by someone else.
//
// In reapAll mode (the agent is PID 1, or a child subreaper) one loop calls
// wait4(-1) whenever SIGCHLD arrives and hands each status to the channel
// registered for that pid; statuses of pids nobody registered (orphans
// reparented to the agent) are dropped, which is what reaping zombies means.
// Starting a process holds forkMu for reading across fork and registration,
// and the loop holds it for writing around each wait4, so a child can never be
// reaped between its fork and its registration.
//
// Otherwise (tests on a host) each started process gets its own wait4(pid)
// goroutine and unrelated children of the process are left alone.
type reaper struct {
	reapAll bool
	// threads, when set, is closed once the agent's threads are reserved
	// (see reserveThreads); no fork happens before.
	threads <-chan struct{}
	// onFork, when set, is called after each successful fork: every
	// process the agent starts goes through start, so the memory guard,
	// which parks while the agent is alone, is woken here and nowhere else.
	onFork func()

	forkMu  sync.RWMutex
	mu      sync.Mutex // guards waiters
	waiters map[int]chan syscall.WaitStatus
}

func newReaper(reapAll bool) *reaper {
	return &reaper{reapAll: reapAll, waiters: map[int]chan syscall.WaitStatus{}}
}

// start runs fork (which must start exactly one child and return its pid) and
// returns a channel that receives the child's exit status exactly once.
func (r *reaper) start(fork func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	if r.threads != nil {
		<-r.threads
	}
	r.forkMu.RLock()
	defer r.forkMu.RUnlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	if r.onFork != nil {
		r.onFork()
	}
	ch := make(chan syscall.WaitStatus, 1)
	if r.reapAll {
		r.mu.Lock()
		r.waiters[pid] = ch
		r.mu.Unlock()
		return pid, ch, nil
	}
	go func() {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		ch <- ws
	}()
	return pid, ch, nil
}

// run reaps children until ctx ends. It is a no-op unless reapAll is set.
func (r *reaper) run(ctx context.Context) {
	if !r.reapAll {
		return
	}
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	r.reapReady()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sigs:
			r.reapReady()
		}
	}
}

// reapReady collects every child that has already exited.
func (r *reaper) reapReady() {
	for {
		var ws syscall.WaitStatus
		r.forkMu.Lock()
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid > 0 {
			r.mu.Lock()
			ch := r.waiters[pid]
			delete(r.waiters, pid)
			r.mu.Unlock()
			if ch != nil {
				ch <- ws
			}
		}
		r.forkMu.Unlock()
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

// exitCode maps a wait status to a shell-style exit code: the exit status,
// or 128+signal for a process killed by a signal.
func exitCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	default:
		return -1
	}
}

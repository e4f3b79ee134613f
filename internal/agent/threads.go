package agent

import (
	"runtime"
	"sync"
)

// reservedThreads is how many idle OS threads the agent keeps from its
// start.
//
// A sandbox's task limit (pids.max, RLIMIT_NPROC) counts threads, and
// commands share it with the agent. When a fork bomb holds every task, a
// command merely fails to fork, but the Go runtime treats a failed thread
// creation as fatal: the agent, PID 1, would die with its sandbox. Go
// never frees an idle thread, so threads made at start stay available to
// the agent whatever its commands do later.
const reservedThreads = 8

// reserveThreads leaves at least n OS threads idle in the runtime's pool:
// n goroutines each hold their own locked thread (creating the threads
// the pool lacks) until all n are running, then unlock and exit, which
// returns the threads to the idle pool rather than destroying them.
func reserveThreads(n int) {
	var locked, release sync.WaitGroup
	var done sync.WaitGroup
	locked.Add(n)
	release.Add(1)
	done.Add(n)
	for range n {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			locked.Done()
			release.Wait()
			runtime.UnlockOSThread()
		}()
	}
	locked.Wait()
	release.Done()
	done.Wait()
}

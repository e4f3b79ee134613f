package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// MemLimitEnv hands PID 1 the sandbox's memory limit in bytes. When it is
// set the agent runs its OOM guard (see memGuard); the agent removes it from
// the environment of every command it runs.
const MemLimitEnv = "CUBICLE_MEM_LIMIT_BYTES"

// Guard defaults. Under gVisor/systrap every wakeup of a guest thread costs
// the host about 0.4-0.6 ms of CPU whatever it does (measured: a 10 ms
// ticker alone costs 4-6 % of a core, the pread of /proc/meminfo adds
// little), so the guard polls slowly while usage is low, fast only near
// the threshold, and not at all while no command's process is alive. A fast
// allocator may get one slow interval ahead of the guard (about 200 MiB at
// 2 GiB/s); the gvisor driver's host cgroup headroom absorbs that. A command
// the agent starts makes the guard poll the processes' RSS fast, without
// meminfo, for guardWakeFast (a poll reads two files per process: under
// 5 ms for a few): a short hog (`dd bs=256M count=1` commits, copies and
// frees its buffer within about 100 ms) would otherwise often live and die
// between two slow polls, or before meminfo shows it.
const (
	guardFastInterval = 10 * time.Millisecond
	guardSlowInterval = 100 * time.Millisecond
	// guardFastAbove is the share of the threshold above which the guard
	// polls fast; it also polls fast after usage rose by more than
	// 1/guardJumpDivisor of the limit within one poll.
	guardFastAbove   = 0.5
	guardJumpDivisor = 16
	// guardExitWait bounds how long the guard waits for a victim to release
	// its memory before it may pick another one.
	guardExitWait = time.Second
	// guardWakeFast is how long the guard polls fast after the agent
	// started a command (see memGuard.wake).
	guardWakeFast = time.Second
)

// GuardThreshold is the usage at which the guard kills, for a limit: the
// limit less 1/64 of it (1 MiB for 64 MiB, 16 MiB for 1 GiB), so a process
// is killed about where the kernel's memory cgroup would kill it on a normal
// Linux machine.
func GuardThreshold(limit int64) int64 { return limit - limit/64 }

// MemGuardKill describes one process the guard killed.
type MemGuardKill struct {
	PID        int       `json:"pid"`
	Comm       string    `json:"comm"`
	RSSBytes   int64     `json:"rss_bytes"`
	UsageBytes int64     `json:"usage_bytes"` // sandbox usage that triggered it
	CommandID  string    `json:"command_id,omitempty"`
	At         time.Time `json:"at"`
}

// MemGuardStats is the body of GET /v1/memguard.
type MemGuardStats struct {
	Enabled bool `json:"enabled"`
	// Reason says why the guard is off (no limit given, or /proc/meminfo
	// describes the host rather than the sandbox, as under the namespace
	// driver, where the kernel's own OOM killer enforces the limit).
	Reason         string `json:"reason,omitempty"`
	LimitBytes     int64  `json:"limit_bytes,omitempty"`
	ThresholdBytes int64  `json:"threshold_bytes,omitempty"`
	UsageBytes     int64  `json:"usage_bytes,omitempty"`
	Polls          int64  `json:"polls"`
	// Parks counts the times the guard stopped polling because nothing
	// but the agent was running (it resumes when a command starts).
	Parks    int64         `json:"parks"`
	Kills    int64         `json:"kills"`
	LastKill *MemGuardKill `json:"last_kill,omitempty"`
}

// memGuard is a user-space OOM killer in the spirit of earlyoom: gVisor has
// no OOM killer of its own, so without it a sandbox whose processes exceed
// the limit has its Sentry killed by the host memory cgroup and everything
// in it dies. The guard polls the sandbox's memory usage and, once it
// crosses threshold, SIGKILLs the process with the largest badness (RSS,
// adjusted by oom_score_adj as Linux does), never PID 1 or the agent.
//
// Invariants: at most one victim is pending at a time (the guard waits for
// it to exit, up to guardExitWait, before measuring again); a process whose
// oom_score_adj is -1000 is never chosen. Stats are guarded by mu; every
// other field is fixed after construction.
type memGuard struct {
	limit, threshold int64
	fast, slow       time.Duration
	// usage returns the sandbox's memory in use and the part of it held
	// by tmpfs files, in bytes.
	usage func() (used, tmpfs int64, err error)
	// pids lists the candidate processes (all of procDir's by default).
	pids    func() ([]int, error)
	procDir string
	self    int
	kill    func(pid int) error
	// onKill tells the user why their command died; it runs after the
	// signal is sent and must not block for long.
	onKill func(k *MemGuardKill, sid, pgid int)
	log    *slog.Logger
	// woken carries wake's nudges to run (capacity 1: nudges coalesce).
	woken chan struct{}

	mu    sync.Mutex
	stats MemGuardStats
}

// newMemGuard returns a guard for limit that meters /proc/meminfo, or a
// disabled one (stats say why) when limit is unset or meminfo is not scoped
// to the sandbox.
func newMemGuard(limit int64, log *slog.Logger) (*memGuard, func()) {
	g := &memGuard{
		limit:     limit,
		threshold: GuardThreshold(limit),
		fast:      guardFastInterval,
		slow:      guardSlowInterval,
		procDir:   "/proc",
		self:      os.Getpid(),
		kill:      func(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) },
		log:       log,
		woken:     make(chan struct{}, 1),
	}
	g.pids = func() ([]int, error) { return listPIDs(g.procDir) }
	if limit <= 0 {
		g.stats.Reason = MemLimitEnv + " not set"
		return g, func() {}
	}
	m, err := openMeminfo("/proc/meminfo")
	if err != nil {
		g.stats.Reason = err.Error()
		return g, func() {}
	}
	total, _, _, err := m.read()
	switch {
	case err != nil:
		g.stats.Reason = err.Error()
	case total > limit+limit/4:
		// The host's meminfo (namespace driver): its usage is not ours.
		g.stats.Reason = fmt.Sprintf("/proc/meminfo shows %d bytes, not the sandbox's limit: the kernel enforces the limit", total)
	default:
		g.usage = m.usage
		g.stats.Enabled = true
		g.stats.LimitBytes, g.stats.ThresholdBytes = limit, g.threshold
	}
	var once sync.Once
	return g, func() { once.Do(m.close) }
}

// Stats returns a snapshot of the guard's counters.
func (g *memGuard) Stats() MemGuardStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.stats
	if s.LastKill != nil {
		k := *s.LastKill
		s.LastKill = &k
	}
	return s
}

// wake tells the guard that a command has just started: it polls at once
// and then fast for guardWakeFast. It never blocks.
func (g *memGuard) wake() {
	select {
	case g.woken <- struct{}{}:
	default:
	}
}

// run polls until ctx ends: fast when usage is near the threshold or rising
// quickly or a command started recently (wake), slow otherwise, and not at
// all while no process but the agent runs, so an idle sandbox costs
// nothing. A no-op when the guard is disabled.
func (g *memGuard) run(ctx context.Context) {
	if g.usage == nil {
		return
	}
	t := time.NewTimer(g.slow)
	defer t.Stop()
	prev := int64(-1) // no reading yet: the first is not a jump
	var tmpfs int64
	var failing bool
	var fastUntil time.Time
	tick := t.C // nil while parked: only wake or ctx can end the wait
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.woken:
			fastUntil = time.Now().Add(guardWakeFast)
			if tick == nil {
				tick = t.C
				prev = -1 // a parked spell is not a jump
			}
		case <-tick:
		}
		if time.Now().Before(fastUntil) {
			// A command started lately: poll its RSS alone. While a
			// process commits memory in one system call, gVisor's
			// meminfo lags its RSS by 100 ms and more (seen: 24 MiB
			// while dd's RSS was 261 MiB) and reading meminfo can block
			// until the call ends (seen: 250-450 ms), after which the
			// hog frees everything within milliseconds: the kill must
			// land while the call runs. tmpfs is as of the last
			// meminfo.
			if rss := g.rssTotal(); rss+tmpfs >= g.threshold {
				g.act(ctx, rss+tmpfs)
			}
			g.mu.Lock()
			g.stats.Polls++
			g.mu.Unlock()
			t.Reset(g.fast)
			continue
		}
		next := g.slow
		u, shm, err := g.usage()
		if err == nil {
			tmpfs = shm
		}
		switch {
		case err != nil:
			if !failing {
				g.log.Warn("memguard: read usage", "err", err)
			}
		case u >= g.threshold || prev >= 0 && u-prev > g.limit/guardJumpDivisor:
			// Confirm with the processes' RSS plus tmpfs, which unlike
			// meminfo drops the moment a victim exits: a high meminfo
			// with small processes and little in tmpfs is memory on its
			// way back. tmpfs counts because no kill frees it, so the
			// processes must fit in what it leaves (the drivers size
			// tmpfs mounts to a fraction of the limit for that).
			// A jump is checked too: meminfo lags (see above).
			if rss := g.rssTotal(); rss+tmpfs >= g.threshold {
				g.act(ctx, max(u, rss+tmpfs))
			}
			next = g.fast
		case float64(u) >= guardFastAbove*float64(g.threshold):
			next = g.fast
		}
		failing = err != nil
		g.mu.Lock()
		g.stats.Polls++
		g.stats.UsageBytes = u
		g.mu.Unlock()
		prev = u
		if next == g.slow && g.nothingToKill() {
			// Park until a command starts (wake): every process but
			// PID 1 and the agent is one the agent started, so
			// none can appear unannounced, and an idle sandbox
			// then costs no wakeups at all.
			tick = nil
			g.mu.Lock()
			g.stats.Parks++
			g.mu.Unlock()
			continue
		}
		t.Reset(next)
	}
}

// nothingToKill reports whether no live process but PID 1 and the agent
// exists (a failed listing counts as something: keep polling).
func (g *memGuard) nothingToKill() bool {
	pids, err := g.live()
	return err == nil && len(pids) == 0
}

// rssTotal sums the RSS of every live process but PID 1 and the agent.
// Shared pages count once per process, so it overestimates (a shell's own
// pages are under a MiB, and the drivers allow one task per MiB of the
// limit); it is read only when meminfo is over the threshold or jumped, or
// a command is fresh. The agent is left out because
// its RSS is mostly its mapped executable (which meminfo does not count)
// and it is never a victim: counted, it made the confirmation pass while
// meminfo still showed a killed hog's pages (gVisor releases them a few
// hundred milliseconds after the exit), and the guard killed a command well
// under the limit.
func (g *memGuard) rssTotal() int64 {
	pids, _ := g.live()
	var sum int64
	for _, pid := range pids {
		rss, _ := readRSS(g.procDir, pid)
		sum += rss
	}
	return sum
}

// live lists the processes that are alive (not zombies), but PID 1 and
// the agent.
func (g *memGuard) live() ([]int, error) {
	pids, err := g.pids()
	if err != nil {
		return nil, err
	}
	var out []int
	for _, pid := range pids {
		if pid == 1 || pid == g.self {
			continue
		}
		if st, err := readProcStat(g.procDir, pid); err == nil && st.state != 'Z' && st.state != 'X' {
			out = append(out, pid)
		}
	}
	return out, nil
}

// act kills the worst process, then waits for it to go away so that its
// memory is released before usage is measured again.
func (g *memGuard) act(ctx context.Context, usage int64) {
	v, ok := g.pickVictim()
	if !ok {
		g.log.Warn("memguard: over threshold but nothing to kill", "usage", usage, "threshold", g.threshold)
		return
	}
	if err := g.kill(v.pid); err != nil {
		g.log.Warn("memguard: kill", "pid", v.pid, "err", err)
		return
	}
	k := &MemGuardKill{PID: v.pid, Comm: v.comm, RSSBytes: v.rss, UsageBytes: usage, At: time.Now()}
	if g.onKill != nil {
		g.onKill(k, v.sid, v.pgid)
	}
	g.log.Warn("memguard: out of memory: killed process", "pid", v.pid, "comm", v.comm,
		"rss", v.rss, "usage", usage, "limit", g.limit, "command_id", k.CommandID)
	g.mu.Lock()
	g.stats.Kills++
	g.stats.LastKill = k
	g.mu.Unlock()
	deadline := time.Now().Add(guardExitWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if st, err := readProcStat(g.procDir, v.pid); err != nil || st.state == 'Z' || st.state == 'X' {
			return
		}
		time.Sleep(g.fast / 2)
	}
}

// victim is a candidate process and what the guard knows of it.
type victim struct {
	pid, sid, pgid int
	comm           string
	rss            int64
	score          int64
}

// pickVictim returns the candidate with the highest badness: RSS plus
// oom_score_adj thousandths of the limit, like Linux's oom_badness.
func (g *memGuard) pickVictim() (victim, bool) {
	pids, err := g.pids()
	if err != nil {
		g.log.Warn("memguard: list processes", "err", err)
		return victim{}, false
	}
	var best victim
	found := false
	for _, pid := range pids {
		if pid == 1 || pid == g.self {
			continue
		}
		st, err := readProcStat(g.procDir, pid)
		if err != nil || st.state == 'Z' || st.state == 'X' {
			continue
		}
		rss, err := readRSS(g.procDir, pid)
		if err != nil || rss == 0 {
			continue // kernel threads and processes that just exited
		}
		adj := readOOMScoreAdj(g.procDir, pid)
		if adj <= -1000 {
			continue
		}
		v := victim{pid: pid, sid: st.sid, pgid: st.pgid, comm: st.comm, rss: rss, score: rss + int64(adj)*g.limit/1000}
		if !found || v.score > best.score {
			best, found = v, true
		}
	}
	return best, found
}

// meminfo is an open /proc/meminfo. Reading it at offset 0 regenerates it
// (Linux and gVisor alike), so a poll costs one pread.
type meminfo struct {
	fd  int
	buf []byte
}

func openMeminfo(path string) (*meminfo, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("memguard: open %s: %w", path, err)
	}
	return &meminfo{fd: fd, buf: make([]byte, 16<<10)}, nil
}

func (m *meminfo) close() { syscall.Close(m.fd) }

// read returns MemTotal, MemAvailable and Shmem (tmpfs; 0 when absent) in
// bytes.
func (m *meminfo) read() (total, avail, shmem int64, err error) {
	// One pread: the whole file fits the buffer.
	n, err := syscall.Pread(m.fd, m.buf, 0)
	for errors.Is(err, syscall.EINTR) {
		n, err = syscall.Pread(m.fd, m.buf, 0)
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("memguard: read meminfo: %w", err)
	}
	total, avail = -1, -1
	for line := range bytes.Lines(m.buf[:n]) {
		switch {
		case bytes.HasPrefix(line, []byte("MemTotal:")):
			total = meminfoKB(line)
		case bytes.HasPrefix(line, []byte("MemAvailable:")):
			avail = meminfoKB(line)
		case bytes.HasPrefix(line, []byte("Shmem:")):
			shmem = max(meminfoKB(line), 0)
		}
	}
	if total < 0 || avail < 0 {
		return 0, 0, 0, errors.New("memguard: meminfo lacks MemTotal or MemAvailable")
	}
	return total, avail, shmem, nil
}

// usage is MemTotal - MemAvailable: under gVisor, every page the sandbox's
// memory file holds (anonymous memory, tmpfs, page cache in use), each
// counted once. It lags the host by at most one of the Sentry's commit
// scans (throttled to one per 10 ms for small sandboxes). tmpfs is the
// Shmem line: gVisor's tmpfs pages.
func (m *meminfo) usage() (used, tmpfs int64, err error) {
	total, avail, shmem, err := m.read()
	return total - avail, shmem, err
}

// meminfoKB parses "Name:   1234 kB" into bytes, or -1.
func meminfoKB(line []byte) int64 {
	f := bytes.Fields(line)
	if len(f) < 2 {
		return -1
	}
	v, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return -1
	}
	return v << 10
}

// procStat is the part of /proc/<pid>/stat the guard reads.
type procStat struct {
	comm      string
	state     byte
	pgid, sid int
}

func readProcStat(procDir string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	// comm is parenthesised and may contain spaces and parentheses.
	open, end := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("malformed stat of %d", pid)
	}
	f := strings.Fields(string(b[end+1:]))
	if len(f) < 4 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed stat of %d", pid)
	}
	st := procStat{comm: string(b[open+1 : end]), state: f[0][0]}
	st.pgid, _ = strconv.Atoi(f[2])
	st.sid, _ = strconv.Atoi(f[3])
	return st, nil
}

// readRSS returns pid's resident set in bytes from statm.
func readRSS(procDir string, pid int) (int64, error) {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "statm"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("malformed statm of %d", pid)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("malformed statm of %d: %w", pid, err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// readOOMScoreAdj returns pid's oom_score_adj, 0 when unreadable.
func readOOMScoreAdj(procDir string, pid int) int {
	b, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "oom_score_adj"))
	if err != nil {
		return 0
	}
	v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return v
}

// listPIDs returns the numeric entries of procDir.
func listPIDs(procDir string) ([]int, error) {
	ents, err := os.ReadDir(procDir)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// parseMemLimit parses MemLimitEnv's value; empty or invalid gives 0 (off).
func parseMemLimit(v string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// noteOOMKill finds the command the victim belonged to (its process group
// or session is the command's, since every command starts as a group
// leader) and appends an explanation to its output, the way a terminal
// shows the kernel's "Killed". The command then exits 137 (128+SIGKILL)
// when the victim was the command itself or its last child.
func (s *Server) noteOOMKill(k *MemGuardKill, sid, pgid int) {
	sess := s.sessions.byGroup(sid, pgid)
	if sess == nil {
		return
	}
	k.CommandID = sess.id
	sess.notice(fmt.Sprintf("cubicle: out of memory: killed process %d (%s), rss %d MiB; sandbox memory %d MiB of limit %d MiB\n",
		k.PID, k.Comm, k.RSSBytes>>20, k.UsageBytes>>20, s.guard.limit>>20))
}

func (s *Server) handleMemGuard(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.guard.Stats())
}

package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// fakeProc writes a /proc-like tree: pid → (comm, state, rss pages, adj).
// fakeTask is one process of a fakeProc tree: its name, state, RSS in
// pages and oom_score_adj.
type fakeTask struct {
	comm  string
	state byte
	pages int64
	adj   int
}

func fakeProc(t *testing.T, procs map[int]fakeTask) string {
	t.Helper()
	dir := t.TempDir()
	for pid, p := range procs {
		d := filepath.Join(dir, fmt.Sprint(pid))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "stat"), fmt.Appendf(nil, "%d (%s) %c 1 %d %d 0 -1", pid, p.comm, p.state, pid, pid), 0o644)
		os.WriteFile(filepath.Join(d, "statm"), fmt.Appendf(nil, "1000 %d 0 0 0 0 0\n", p.pages), 0o644)
		os.WriteFile(filepath.Join(d, "oom_score_adj"), fmt.Appendf(nil, "%d\n", p.adj), 0o644)
	}
	return dir
}

func TestMemGuardKillsLargestOverThreshold(t *testing.T) {
	type p = fakeTask
	page := int64(os.Getpagesize())
	mib := (1 << 20) / page
	dir := fakeProc(t, map[int]p{
		1:  {"cubicle", 'S', 200 * mib, 0}, // PID 1: never
		5:  {"sleep", 'S', 10 * mib, 0},    //
		7:  {"db", 'S', 60 * mib, -1000},   // exempt
		9:  {"dd (x)", 'R', 40 * mib, 0},   // the victim
		11: {"zombie", 'Z', 100 * mib, 0},  // already dead
		13: {"kthread", 'S', 0, 0},         // no memory
		42: {"self", 'S', 300 * mib, 0},    // the agent itself
	})
	var mu sync.Mutex
	var killed []int
	var noted []*MemGuardKill
	g := &memGuard{
		limit: 64 << 20, threshold: GuardThreshold(64 << 20),
		fast: time.Millisecond, slow: time.Millisecond,
		procDir: dir, self: 42,
		log:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		kill: func(pid int) error { mu.Lock(); killed = append(killed, pid); mu.Unlock(); return nil },
		onKill: func(k *MemGuardKill, sid, pgid int) {
			if sid != 9 || pgid != 9 {
				t.Errorf("victim sid/pgid = %d/%d", sid, pgid)
			}
			noted = append(noted, k)
		},
		usage: func() (int64, int64, error) { return 70 << 20, 0, nil },
	}
	g.pids = func() ([]int, error) { return listPIDs(dir) }
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	g.run(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(killed) == 0 || killed[0] != 9 {
		t.Fatalf("killed %v, want 9 (largest non-exempt live process) first", killed)
	}
	if noted[0].Comm != "dd (x)" || noted[0].RSSBytes != 40<<20 {
		t.Errorf("kill record %+v", noted[0])
	}
	if st := g.Stats(); st.Kills != int64(len(killed)) || st.LastKill == nil {
		t.Errorf("stats %+v", st)
	}
}

func TestMemGuardQuietUnderThresholdOrWithSmallProcesses(t *testing.T) {
	dir := fakeProc(t, map[int]fakeTask{5: {"sh", 'S', 100, 0}})
	for name, usage := range map[string]int64{
		"under threshold": 60 << 20,
		// meminfo high but processes small: memory being released.
		"releasing": 64 << 20,
	} {
		t.Run(name, func(t *testing.T) {
			g := &memGuard{
				limit: 64 << 20, threshold: GuardThreshold(64 << 20),
				fast: time.Millisecond, slow: time.Millisecond, procDir: dir,
				log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
				kill:  func(pid int) error { t.Errorf("killed %d", pid); return nil },
				usage: func() (int64, int64, error) { return usage, 0, nil },
			}
			g.pids = func() ([]int, error) { return listPIDs(dir) }
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			g.run(ctx)
			if st := g.Stats(); st.Polls == 0 || st.Kills != 0 {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestMemGuardCountsTmpfs checks that memory held in tmpfs, which no kill
// frees, counts towards the threshold: with /dev/shm holding half of the
// limit, a process using the other half is killed, before the host cgroup
// would kill the whole sandbox.
func TestMemGuardCountsTmpfs(t *testing.T) {
	mib := (1 << 20) / int64(os.Getpagesize())
	dir := fakeProc(t, map[int]fakeTask{5: {"sh", 'S', 2 * mib, 0}, 9: {"python", 'R', 31 * mib, 0}})
	var killed []int
	g := &memGuard{
		limit: 64 << 20, threshold: GuardThreshold(64 << 20),
		fast: time.Millisecond, slow: time.Millisecond, procDir: dir,
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		kill:  func(pid int) error { killed = append(killed, pid); return nil },
		usage: func() (int64, int64, error) { return 64 << 20, 32 << 20, nil },
	}
	g.pids = func() ([]int, error) { return listPIDs(dir) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	g.run(ctx)
	if len(killed) == 0 || killed[0] != 9 {
		t.Fatalf("killed %v, want 9: 33 MiB of processes plus 32 MiB of tmpfs are over a 64 MiB limit", killed)
	}
}

func TestMemGuardDisabledWhenMeminfoIsTheHosts(t *testing.T) {
	// On a host /proc/meminfo describes the machine, not a 64 MiB sandbox.
	g, closeFn := newMemGuard(64<<20, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer closeFn()
	if st := g.Stats(); st.Enabled || st.Reason == "" {
		t.Errorf("stats %+v, want disabled with a reason", st)
	}
	g2, closeFn2 := newMemGuard(0, nil)
	defer closeFn2()
	if st := g2.Stats(); st.Enabled {
		t.Errorf("enabled without a limit: %+v", st)
	}
	g2.run(context.Background()) // returns at once
}

func TestMemGuardEndpoint(t *testing.T) {
	c, _, _ := startAgent(t, WithMemLimit(64<<20))
	st, err := c.MemGuard(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Enabled {
		t.Errorf("guard enabled on the host: %+v", st)
	}
}

func TestParseMemLimit(t *testing.T) {
	for in, want := range map[string]int64{"": 0, "x": 0, "-5": 0, "67108864": 64 << 20, " 42\n": 42} {
		if got := parseMemLimit(in); got != want {
			t.Errorf("parseMemLimit(%q) = %d, want %d", in, got, want)
		}
	}
}

// TestMemGuardChecksRSSOfAFreshCommand replays `dd bs=256M count=1` under a
// 64 MiB limit: meminfo still shows 24 MiB while dd's RSS is 261 MiB, and dd
// frees it all within about 100 ms. Once wake says a command started, the
// guard must poll at once and kill on RSS, not wait for a slow poll or for
// meminfo.
func TestMemGuardChecksRSSOfAFreshCommand(t *testing.T) {
	mib := (1 << 20) / int64(os.Getpagesize())
	dir := fakeProc(t, map[int]fakeTask{5: {"sh", 'S', 2 * mib, 0}, 9: {"dd", 'R', 261 * mib, 0}})
	for _, woken := range []bool{false, true} {
		killed := make(chan int, 10)
		g := &memGuard{
			limit: 64 << 20, threshold: GuardThreshold(64 << 20),
			fast: time.Millisecond, slow: time.Hour, procDir: dir,
			log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
			kill:  func(pid int) error { killed <- pid; return nil },
			usage: func() (int64, int64, error) { return 24 << 20, 0, nil },
			woken: make(chan struct{}, 1),
		}
		g.pids = func() ([]int, error) { return listPIDs(dir) }
		if woken {
			g.wake()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		g.run(ctx)
		cancel()
		switch {
		case woken && len(killed) == 0:
			t.Fatal("a fresh command's 261 MiB RSS under a 64 MiB limit was not killed while meminfo lagged")
		case woken && <-killed != 9:
			t.Fatal("killed the wrong process")
		case !woken && len(killed) != 0:
			t.Fatal("killed without a poll: the slow interval is an hour")
		}
	}
}

// TestMemGuardLeavesAgentOutOfConfirmation: after a hog's kill meminfo stays
// at the limit for a few hundred milliseconds under gVisor. The agent's own
// RSS (mostly its mapped executable) must not make a small command look
// like the cause: counted, a 20 MiB dd was killed under a 64 MiB limit.
func TestMemGuardLeavesAgentOutOfConfirmation(t *testing.T) {
	mib := (1 << 20) / int64(os.Getpagesize())
	dir := fakeProc(t, map[int]fakeTask{1: {"cubicle", 'S', 30 * mib, 0}, 42: {"cubicle", 'S', 30 * mib, 0}, 5: {"sh", 'S', 2 * mib, 0}, 9: {"dd", 'R', 20 * mib, 0}})
	g := &memGuard{
		limit: 64 << 20, threshold: GuardThreshold(64 << 20),
		fast: time.Millisecond, slow: time.Millisecond, procDir: dir, self: 42,
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		kill:  func(pid int) error { t.Errorf("killed %d", pid); return nil },
		usage: func() (int64, int64, error) { return 64 << 20, 0, nil },
	}
	g.pids = func() ([]int, error) { return listPIDs(dir) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	g.run(ctx)
	if st := g.Stats(); st.Polls == 0 || st.Kills != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestMemGuardParksWhileNothingRuns: with only PID 1 and the agent alive
// the guard stops polling (an idle sandbox then costs no wakeups); a wake
// (a command started) resumes polling, which goes on while the command's
// process lives and parks again once it is gone.
func TestMemGuardParksWhileNothingRuns(t *testing.T) {
	dir := fakeProc(t, map[int]fakeTask{1: {"cubicle", 'S', 100, 0}, 42: {"self", 'S', 100, 0}})
	g := &memGuard{
		limit: 64 << 20, threshold: GuardThreshold(64 << 20),
		fast: time.Millisecond, slow: time.Millisecond, procDir: dir, self: 42,
		log:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		kill:  func(pid int) error { t.Errorf("killed %d", pid); return nil },
		usage: func() (int64, int64, error) { return 8 << 20, 0, nil },
		woken: make(chan struct{}, 1),
	}
	g.pids = func() ([]int, error) { return listPIDs(dir) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(what string, ok func(MemGuardStats) bool) MemGuardStats {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if st := g.Stats(); ok(st) {
				return st
			}
		}
		t.Fatalf("%s: stats %+v", what, g.Stats())
		return MemGuardStats{}
	}
	st := waitFor("parked", func(s MemGuardStats) bool { return s.Parks == 1 })
	time.Sleep(50 * time.Millisecond) // 50 slow intervals
	if now := g.Stats(); now.Polls != st.Polls || now.Parks != 1 {
		t.Fatalf("parked guard polled: %+v then %+v", st, now)
	}

	// A command starts: the guard polls while its process lives.
	fakeTaskDir := filepath.Join(dir, "7")
	os.MkdirAll(fakeTaskDir, 0o755)
	os.WriteFile(filepath.Join(fakeTaskDir, "stat"), []byte("7 (sleep) S 1 7 7 0 -1"), 0o644)
	os.WriteFile(filepath.Join(fakeTaskDir, "statm"), []byte("1000 100 0 0 0 0 0\n"), 0o644)
	g.wake()
	time.Sleep(guardWakeFast + 100*time.Millisecond) // past the fast spell a wake starts
	a := g.Stats()
	time.Sleep(20 * time.Millisecond)
	if b := g.Stats(); b.Parks != 1 || b.Polls <= a.Polls {
		t.Fatalf("with a live process the guard must keep polling: %+v then %+v", a, b)
	}
	os.RemoveAll(fakeTaskDir)
	waitFor("parked again", func(s MemGuardStats) bool { return s.Parks == 2 })
}

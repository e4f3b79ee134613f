package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// env is what every test in this package shares, built once by TestMain:
// the runsc binary, a read-only busybox lower dir, and the stand-in agent.
type env struct {
	runsc   string
	lower   string
	standin string
	tmp     string
	netSeq  atomic.Int32
}

// standinPort is where the stand-in agent listens inside the sandbox.
const standinPort = "8080"

var testEnv *env // set by TestMain only; read-only afterwards

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	e, skip, err := setupEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gvisor tests: setup:", err)
		return 1
	}
	if skip != "" {
		// Only a missing runsc (or non-root) skips: say why, loudly.
		fmt.Println("gvisor tests: SKIPPING:", skip)
	}
	testEnv = e
	code := m.Run()
	if e != nil {
		os.RemoveAll(e.tmp)
	}
	return code
}

// setupEnv finds runsc and builds the shared fixtures. skip is non-empty
// when this machine cannot run gVisor at all.
func setupEnv() (e *env, skip string, err error) {
	if os.Geteuid() != 0 {
		return nil, "not root", nil
	}
	rs, err := findTestRunsc()
	if err != nil {
		return nil, fmt.Sprintf("no runsc (%v); build it with `make runsc` or set CUBICLE_RUNSC", err), nil
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return nil, "", fmt.Errorf("busybox (busybox-static) is required: %w", err)
	}
	tmp, err := os.MkdirTemp("", "cubicle-gvisor-test-")
	if err != nil {
		return nil, "", err
	}
	e = &env{runsc: rs, tmp: tmp, lower: filepath.Join(tmp, "lower"), standin: filepath.Join(tmp, "standin")}
	if err := buildBusyboxRoot(busybox, e.lower); err != nil {
		return nil, "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, "", fmt.Errorf("go toolchain not on PATH (needed to build the stand-in agent): %w", err)
	}
	cmd := exec.Command(goBin, "build", "-o", e.standin, "./testdata/standin")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("build stand-in agent: %v: %s", err, out)
	}
	return e, "", nil
}

// findTestRunsc prefers $CUBICLE_RUNSC, then the repo's bin/runsc, then
// FindRunsc's own search.
func findTestRunsc() (string, error) {
	if p := os.Getenv("CUBICLE_RUNSC"); p != "" {
		return FindRunsc(p)
	}
	dir, _ := os.Getwd()
	for ; dir != "/" && dir != "."; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "bin", "runsc")
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
			break
		}
	}
	return FindRunsc("")
}

// buildBusyboxRoot makes a minimal root filesystem: a static busybox with a
// symlink per applet, and the usual empty directories.
func buildBusyboxRoot(busybox, dir string) error {
	for _, d := range []string{"bin", "proc", "sys", "dev", "etc", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return err
	}
	data, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", applet)); err != nil && !os.IsExist(err) {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
}

// requireEnv skips t (fails it under CI) when TestMain found no runsc.
func requireEnv(tb testing.TB) *env {
	tb.Helper()
	if testEnv == nil {
		testenv.Skip(tb, "runsc unavailable (see TestMain output)")
	}
	return testEnv
}

// newID returns a fresh sandbox id.
func newID(tb testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// newDriver returns a Driver on a fresh state dir.
func newDriver(tb testing.TB, opts ...Option) *Driver {
	e := requireEnv(tb)
	dir := tb.TempDir()
	d, err := New(e.runsc, dir, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	// runsc bind-mounts an empty network namespace for its gofers at
	// <root>/null-netns, possibly several times over when first starts
	// race; it outlives every sandbox.
	tb.Cleanup(func() { d.Close() })
	return d
}

// unmountAll removes every mount stacked on path.
func unmountAll(path string) {
	for unix.Unmount(path, unix.MNT_DETACH) == nil {
	}
}

// rootFS mounts a fresh overlay over the busybox lower dir and returns the
// merged and upper dirs.
func rootFS(tb testing.TB) (merged, upper string) {
	e := requireEnv(tb)
	base := tb.TempDir()
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", e.lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		tb.Fatalf("mount overlay: %v", err)
	}
	tb.Cleanup(func() { unix.Unmount(merged, unix.MNT_DETACH) })
	return merged, upper
}

// netNS creates a network namespace with eth0 = <ip>/30 and a default route
// via the host end of a veth pair, like the network package does, and
// returns its path and the sandbox's address. A /30 whose host address is
// already on the host (a killed test run's leftover veth) is skipped: its
// route would capture this sandbox's traffic.
func netNS(tb testing.TB) (path, ip string) {
	e := requireEnv(tb)
	var n int32
	var hostIP, sbIP string
	for {
		n = e.netSeq.Add(1)
		a, b := n/64, (n%64)*4
		hostIP, sbIP = fmt.Sprintf("10.213.%d.%d", a, b+1), fmt.Sprintf("10.213.%d.%d", a, b+2)
		if !hostHas(tb, hostIP) {
			break
		}
		tb.Logf("skipping %s/30: already on the host", hostIP)
	}
	name := fmt.Sprintf("gvt%d-%d", os.Getpid(), n)
	host := fmt.Sprintf("gvt%dh%d", os.Getpid()%100000, n)
	cmds := [][]string{
		{"netns", "add", name},
		{"link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"addr", "add", hostIP + "/30", "dev", host},
		{"link", "set", host, "up"},
		{"-n", name, "addr", "add", sbIP + "/30", "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "route", "add", "default", "via", hostIP},
	}
	tb.Cleanup(func() {
		exec.Command("ip", "link", "del", host).Run()
		exec.Command("ip", "netns", "del", name).Run()
	})
	for _, c := range cmds {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
	return "/run/netns/" + name, sbIP
}

// hostHas reports whether ip is an address of one of the host's links.
func hostHas(tb testing.TB, ip string) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		tb.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.String() == ip {
			return true
		}
	}
	return false
}

// sandbox is one started test sandbox.
type sandbox struct {
	id, ip, upper string
	spec          runtime.Spec
}

// startSandbox starts the stand-in agent in a fresh sandbox on d, waits
// until it answers, and stops it when the test ends.
func startSandbox(tb testing.TB, d *Driver, limits runtime.Limits) *sandbox {
	tb.Helper()
	e := requireEnv(tb)
	merged, upper := rootFS(tb)
	ns, ip := netNS(tb)
	s := &sandbox{id: newID(tb), ip: ip, upper: upper}
	s.spec = runtime.Spec{
		ID:          s.id,
		RootFS:      merged,
		AgentBinary: e.standin,
		Env:         []string{"PATH=/bin", "STANDIN_PORT=" + standinPort},
		Hostname:    "sb-" + s.id[:8],
		NetNS:       ns,
		Limits:      limits,
	}
	ctx := context.Background()
	t0 := time.Now()
	if err := d.Start(ctx, s.spec); err != nil {
		tb.Fatalf("Start: %v", err)
	}
	started := time.Since(t0)
	tb.Cleanup(func() {
		if err := d.Stop(context.Background(), s.id); err != nil {
			tb.Errorf("Stop: %v", err)
		}
	})
	waitReady(tb, s)
	tb.Logf("sandbox %s: Start %v, agent answering after %v", s.id, started, time.Since(t0))
	return s
}

// waitReady polls the stand-in agent until it answers.
func waitReady(tb testing.TB, s *sandbox) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c := http.Client{Timeout: time.Second}
		resp, err := c.Get(s.url("/hostname", nil))
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("stand-in agent at %s never answered: %v", s.ip, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *sandbox) url(path string, q url.Values) string {
	u := "http://" + s.ip + ":" + standinPort + path
	if q != nil {
		u += "?" + q.Encode()
	}
	return u
}

// get fetches path from the stand-in agent and returns the body.
func (s *sandbox) get(tb testing.TB, path string, q url.Values) string {
	tb.Helper()
	body, err := s.tryGet(path, q, 90*time.Second)
	if err != nil {
		tb.Fatalf("GET %s: %v", path, err)
	}
	return body
}

func (s *sandbox) tryGet(path string, q url.Values, timeout time.Duration) (string, error) {
	c := http.Client{Timeout: timeout}
	resp, err := c.Get(s.url(path, q))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("status %s: %s", resp.Status, b)
	}
	return string(b), err
}

// sh runs a shell command inside the sandbox via the stand-in agent.
func (s *sandbox) sh(tb testing.TB, c string) string {
	tb.Helper()
	return s.get(tb, "/sh", url.Values{"c": {c}})
}

// processesMentioning lists host pids whose command line contains s.
func processesMentioning(s string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

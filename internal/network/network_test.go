package network

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// testPool is kept apart from the default pool so a daemon running on the
// same host is not disturbed.
var testPool = netip.MustParsePrefix("10.251.0.0/24")

// blockedTimeout is how long a dial that should not connect is given;
// reachTimeout is how long one that should is given: long enough for TCP to
// retransmit a lost SYN (1 s) on a loaded host, since reachability, not
// speed, is what those checks assert.
const (
	blockedTimeout = 700 * time.Millisecond
	reachTimeout   = 3 * time.Second
)

type testEnv struct {
	stateDir string
	netnsDir string
}

func newEnv(t *testing.T) *testEnv {
	t.Helper()
	testenv.RequireRoot(t, "creates namespaces, links and nftables rules")
	env := &testEnv{stateDir: t.TempDir(), netnsDir: t.TempDir()}
	// Runs before TempDir's RemoveAll: New makes netnsDir a mount point.
	t.Cleanup(func() { _ = unix.Unmount(env.netnsDir, unix.MNT_DETACH) })
	return env
}

func (e *testEnv) manager(t *testing.T) *Manager {
	t.Helper()
	m, err := New(context.Background(), Config{StateDir: e.stateDir, Pool: testPool}, WithNetNSDir(e.netnsDir))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

func randID(t *testing.T, prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// snapshot counts what endpoints leave on the host. links is the sorted
// set of test-pool link indexes, so a link that goes away between two
// snapshots (the kernel destroys a deleted netns's veth asynchronously,
// after its test has ended) is told apart from one that was left behind.
type snapshot struct {
	links                      string
	netnsFiles, records, rules int
}

// leakedSince reports what s holds that before did not ("" for nothing).
func (s snapshot) leakedSince(before snapshot) string {
	had := map[string]bool{}
	for _, l := range strings.Fields(before.links) {
		had[l] = true
	}
	var extra []string
	for _, l := range strings.Fields(s.links) {
		if !had[l] {
			extra = append(extra, "link "+l)
		}
	}
	if s.netnsFiles != before.netnsFiles || s.records != before.records || s.rules != before.rules {
		extra = append(extra, fmt.Sprintf("counts %+v, were %+v", s, before))
	}
	return strings.Join(extra, "; ")
}

func (e *testEnv) snapshot(t *testing.T) snapshot {
	t.Helper()
	// Only links holding an address of the test pool are this test's: other
	// sandboxes on the host may come and go while it runs.
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	links := map[int]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && testPool.Contains(ip) {
			links[a.LinkIndex] = true
		}
	}
	nsFiles, _ := os.ReadDir(e.netnsDir)
	recs, _ := os.ReadDir(e.stateDir)
	rules, err := RuleCount()
	if err != nil {
		t.Fatalf("count rules: %v", err)
	}
	idx := make([]int, 0, len(links))
	for i := range links {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	return snapshot{links: strings.Trim(fmt.Sprint(idx), "[]"), netnsFiles: len(nsFiles), records: len(recs), rules: rules}
}

// inNS runs fn on a fresh OS thread switched into the netns at path. The
// thread stays locked and is discarded when fn returns, so no other
// goroutine ever runs in that namespace. Sockets keep the namespace they
// were created in.
func inNS(t *testing.T, path string, fn func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with us
		h, err := netns.GetFromPath(path)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		fn()
		errc <- nil
	}()
	if err := <-errc; err != nil {
		t.Fatalf("enter netns %s: %v", path, err)
	}
}

func dialFrom(t *testing.T, nsPath, addr string) (net.Conn, error) {
	return dialFromWithin(t, nsPath, addr, blockedTimeout)
}

func dialFromWithin(t *testing.T, nsPath, addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	var err error
	inNS(t, nsPath, func() { c, err = net.DialTimeout("tcp4", addr, timeout) })
	return c, err
}

func listenIn(t *testing.T, nsPath, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	var err error
	inNS(t, nsPath, func() { l, err = net.Listen("tcp4", addr) })
	if err != nil {
		t.Fatalf("listen in %s on %s: %v", nsPath, addr, err)
	}
	t.Cleanup(func() { l.Close() })
	serve(l)
	return l
}

// serve accepts and echoes the peer's address, until l is closed.
func serve(l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s\n", c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
}

func mustReach(t *testing.T, nsPath, addr string) string {
	t.Helper()
	var c net.Conn
	var err error
	if nsPath == "" {
		c, err = net.DialTimeout("tcp4", addr, reachTimeout)
	} else {
		c, err = dialFromWithin(t, nsPath, addr, reachTimeout)
	}
	if err != nil {
		t.Fatalf("dial %s from %q: %v", addr, nsPath, err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	b, _ := io.ReadAll(c)
	return strings.TrimSpace(string(b))
}

func mustNotReach(t *testing.T, nsPath, addr, what string) {
	t.Helper()
	c, err := dialFrom(t, nsPath, addr)
	if err == nil {
		c.Close()
		t.Fatalf("%s: sandbox reached %s", what, addr)
	}
	t.Logf("%s: blocked as expected (%v)", what, err)
}

// outside is a namespace the test owns that plays "the internet": reached
// from the host over a veth that is not a sandbox veth, with a fake metadata
// address on its lo.
type outside struct {
	ns     string
	hostIP netip.Addr // host side of the veth; what NAT'd traffic appears from
	ip     netip.Addr
}

func newOutside(t *testing.T, dir string) *outside {
	t.Helper()
	o := &outside{ns: filepath.Join(dir, "outside")}
	// A /24 of 198.18/15 that nothing on the host uses yet (another test's
	// leftovers would otherwise capture the route).
	onHost, err := hostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	third := byte(time.Now().UnixNano()%200) + 10
	for i := 0; i < 200; i++ {
		third = byte((int(third)-10+1)%200) + 10
		if !onHost[netip.AddrFrom4([4]byte{198, 18, third, 1})] {
			break
		}
	}
	o.hostIP = netip.AddrFrom4([4]byte{198, 18, third, 1})
	o.ip = netip.AddrFrom4([4]byte{198, 18, third, 2})
	if err := createNetNS(o.ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNetNS(o.ns) })
	h, err := netns.GetFromPath(o.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	in, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	name := "xo" + hex.EncodeToString([]byte{third, byte(os.Getpid())})
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h))}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("outside veth: %v", err)
	}
	host, _ := netlink.LinkByName(name)
	t.Cleanup(func() { _ = netlink.LinkDel(host) })
	must(t, netlink.AddrAdd(host, addr(o.hostIP, 30)))
	must(t, netlink.LinkSetUp(host))
	eth, _ := in.LinkByName("eth0")
	lo, _ := in.LinkByName("lo")
	must(t, in.AddrAdd(eth, addr(o.ip, 30)))
	must(t, in.AddrAdd(lo, addr(netip.MustParseAddr("169.254.169.254"), 32)))
	must(t, in.LinkSetUp(eth))
	must(t, in.LinkSetUp(lo))
	waitOperUp(netlinkHandle{}, host.Attrs().Index)
	waitOperUp(in, eth.Attrs().Index)
	must(t, in.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: o.hostIP.AsSlice()}))
	// Route the metadata address to the outside namespace (removed with the link).
	must(t, netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(169, 254, 169, 254).To4(), Mask: net.CIDRMask(32, 32)}, Gw: o.ip.AsSlice()}))
	return o
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPolicy(t *testing.T) {
	env := newEnv(t)
	ctx := context.Background()
	m := env.manager(t)
	out := newOutside(t, t.TempDir())
	before := env.snapshot(t)

	a, err := m.Setup(ctx, randID(t, "a"))
	must(t, err)
	b, err := m.Setup(ctx, randID(t, "b"))
	must(t, err)
	defer m.Teardown(ctx, a.ID)
	defer m.Teardown(ctx, b.ID)
	if a.SandboxIP == b.SandboxIP || a.HostIf == b.HostIf || !testPool.Contains(a.SandboxIP) || a.PrefixLen != 30 {
		t.Fatalf("bad endpoints: %+v %+v", a, b)
	}
	if len(a.HostIf) > 15 || !strings.HasPrefix(a.HostIf, HostIfPrefix) {
		t.Fatalf("host if name %q", a.HostIf)
	}
	// Setup returns only once both ends carry traffic: before the kernel's
	// link watcher has run, a new veth drops what is sent through it.
	if l, err := netlink.LinkByName(a.HostIf); err != nil || l.Attrs().OperState != netlink.OperUp {
		t.Fatalf("host end %s after Setup: %v, %v; want operstate up", a.HostIf, l, err)
	}
	inNS(t, a.NetNS, func() {
		if l, err := netlink.LinkByName(SandboxIfName); err != nil || l.Attrs().OperState != netlink.OperUp {
			t.Errorf("sandbox end after Setup: %v, %v; want operstate up", l, err)
		}
	})

	t.Run("host reaches agent via nsenter child", func(t *testing.T) {
		cmd := exec.Command("nsenter", "--net="+a.NetNS, "busybox", "nc", "-l", "-p", "9000")
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		must(t, cmd.Start())
		defer cmd.Process.Kill()
		var c net.Conn
		deadline := time.Now().Add(3 * time.Second)
		for c, err = nil, errors.New("no try"); err != nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			c, err = net.DialTimeout("tcp4", net.JoinHostPort(a.SandboxIP.String(), "9000"), time.Second)
		}
		must(t, err)
		fmt.Fprintln(c, "hello-agent")
		c.Close()
		_ = cmd.Wait()
		if !strings.Contains(stdout.String(), "hello-agent") {
			t.Fatalf("listener in sandbox got %q", stdout.String())
		}
	})

	t.Run("sandbox cannot open connections to the host", func(t *testing.T) {
		l, err := net.Listen("tcp4", "0.0.0.0:0")
		must(t, err)
		defer l.Close()
		serve(l)
		port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
		mustReach(t, "", net.JoinHostPort(a.HostIP.String(), port)) // the listener is really there
		mustNotReach(t, a.NetNS, net.JoinHostPort(a.HostIP.String(), port), "own host-side IP")
		mustNotReach(t, a.NetNS, net.JoinHostPort(b.HostIP.String(), port), "other sandbox's host-side IP")
		mustNotReach(t, a.NetNS, net.JoinHostPort(out.hostIP.String(), port), "another host address")
	})

	t.Run("host loopback is not the sandbox's", func(t *testing.T) {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		must(t, err)
		defer l.Close()
		serve(l)
		port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
		mustReach(t, "", l.Addr().String())
		mustNotReach(t, a.NetNS, net.JoinHostPort("127.0.0.1", port), "host 127.0.0.1")
		mustNotReach(t, a.NetNS, net.JoinHostPort(a.HostIP.String(), port), "127-bound listener via HostIP")
		for _, p := range []string{"all", a.HostIf} {
			v, err := os.ReadFile("/proc/sys/net/ipv4/conf/" + p + "/route_localnet")
			must(t, err)
			if strings.TrimSpace(string(v)) != "0" {
				t.Fatalf("route_localnet on %s = %s", p, v)
			}
		}
	})

	t.Run("no sandbox to sandbox", func(t *testing.T) {
		l := listenIn(t, b.NetNS, net.JoinHostPort(b.SandboxIP.String(), "0"))
		mustReach(t, "", l.Addr().String())
		mustNotReach(t, a.NetNS, l.Addr().String(), "other sandbox")
		mustNotReach(t, a.NetNS, "10.251.0.250:80", "unallocated pool address")
	})

	t.Run("no metadata", func(t *testing.T) {
		l := listenIn(t, out.ns, "169.254.169.254:0")
		mustReach(t, "", l.Addr().String())
		mustNotReach(t, a.NetNS, l.Addr().String(), "169.254.169.254")
	})

	t.Run("egress is masqueraded", func(t *testing.T) {
		l := listenIn(t, out.ns, net.JoinHostPort(out.ip.String(), "0"))
		seen := mustReach(t, a.NetNS, l.Addr().String())
		if seen != out.hostIP.String() {
			t.Fatalf("outside saw source %s, want NAT'd %s", seen, out.hostIP)
		}
	})

	must(t, m.Teardown(ctx, a.ID))
	must(t, m.Teardown(ctx, b.ID))
	if leak := env.snapshot(t).leakedSince(before); leak != "" {
		t.Fatalf("leak: %s", leak)
	}
}

func TestIdempotenceAndRestart(t *testing.T) {
	env := newEnv(t)
	ctx := context.Background()
	env.manager(t)
	before := env.snapshot(t)
	m := env.manager(t) // New is idempotent
	if leak := env.snapshot(t).leakedSince(before); leak != "" {
		t.Fatalf("second New changed state: %s", leak)
	}

	id := randID(t, "r")
	ep, err := m.Setup(ctx, id)
	must(t, err)
	again, err := m.Setup(ctx, id)
	must(t, err)
	if *again != *ep {
		t.Fatalf("second Setup: %+v, want %+v", again, ep)
	}

	// Daemon restart: a new Manager over the same state.
	m2 := env.manager(t)
	got, err := m2.Lookup(ctx, id)
	must(t, err)
	if *got != *ep {
		t.Fatalf("Lookup after restart: %+v, want %+v", got, ep)
	}
	ids, err := m2.List(ctx)
	must(t, err)
	if len(ids) != 1 || ids[0] != id {
		t.Fatalf("List = %v", ids)
	}

	// Host reboot: links and netns mounts are gone, the record is not.
	must(t, m2.unplumb(ep))
	got, err = m2.Lookup(ctx, id)
	must(t, err)
	if *got != *ep {
		t.Fatalf("Lookup after reboot: %+v, want %+v", got, ep)
	}
	l := listenIn(t, got.NetNS, net.JoinHostPort(got.SandboxIP.String(), "0"))
	if seen := mustReach(t, "", l.Addr().String()); seen != got.HostIP.String() {
		t.Fatalf("sandbox saw the daemon as %s, want %s", seen, got.HostIP)
	}
	l.Close()

	if _, err := m2.Lookup(ctx, "never-set-up"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lookup unknown: %v", err)
	}
	must(t, m2.Teardown(ctx, id))
	must(t, m2.Teardown(ctx, id))
	if _, err := m2.Lookup(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lookup after Teardown: %v", err)
	}
	if _, err := m2.Setup(ctx, "../escape"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Setup with bad id: %v", err)
	}
	if leak := env.snapshot(t).leakedSince(before); leak != "" {
		t.Fatalf("leak: %s", leak)
	}
}

func TestConcurrentSetup(t *testing.T) {
	env := newEnv(t)
	ctx := context.Background()
	m := env.manager(t)
	before := env.snapshot(t)

	const n = 8
	eps := make([]*Endpoint, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { eps[i], errs[i] = m.Setup(ctx, randID(t, fmt.Sprint("c", i))) })
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for i := range n {
		must(t, errs[i])
		if seen[eps[i].SandboxIP] {
			t.Fatalf("address %s handed out twice", eps[i].SandboxIP)
		}
		seen[eps[i].SandboxIP] = true
		// Lowest-free allocation: n endpoints use exactly the first n /30s.
		if idx := int(eps[i].SandboxIP.As4()[3]) / 4; idx >= n {
			t.Fatalf("%s is not among the first %d subnets", eps[i].SandboxIP, n)
		}
	}
	for i := range n {
		wg.Go(func() { errs[i] = m.Teardown(ctx, eps[i].ID) })
	}
	wg.Wait()
	for i := range n {
		must(t, errs[i])
	}
	if leak := env.snapshot(t).leakedSince(before); leak != "" {
		t.Fatalf("leak: %s", leak)
	}
}

// TestTwoManagersOnePool: two daemons on one host with the same pool
// (their own state dirs, the host's netns dir) setting up at once never
// hand out the same address: each skips what the other has put on the
// host, under the host-wide allocation lock.
func TestTwoManagersOnePool(t *testing.T) {
	env := newEnv(t)
	ctx := context.Background()
	before := env.snapshot(t)
	other := &testEnv{stateDir: t.TempDir(), netnsDir: env.netnsDir}
	ms := []*Manager{env.manager(t), other.manager(t)}

	const n = 8
	eps := make([]*Endpoint, 2*n)
	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	for i := range 2 * n {
		wg.Go(func() { eps[i], errs[i] = ms[i%2].Setup(ctx, randID(t, fmt.Sprint("p", i))) })
	}
	wg.Wait()
	seen := map[netip.Addr]string{}
	for i := range 2 * n {
		must(t, errs[i])
		if id, dup := seen[eps[i].SandboxIP]; dup {
			t.Errorf("address %s handed out to %s and %s", eps[i].SandboxIP, id, eps[i].ID)
		}
		seen[eps[i].SandboxIP] = eps[i].ID
	}
	for i := range 2 * n {
		wg.Go(func() { errs[i] = ms[i%2].Teardown(ctx, eps[i].ID) })
	}
	wg.Wait()
	for i := range 2 * n {
		must(t, errs[i])
	}
	if leak := env.snapshot(t).leakedSince(before); leak != "" {
		t.Fatalf("leak: %s", leak)
	}
}

func TestSetupFailureUndoes(t *testing.T) {
	env := newEnv(t)
	ctx := context.Background()
	m := env.manager(t)
	before := env.snapshot(t)
	id := randID(t, "f")
	// A directory where the netns file belongs makes setup fail after the
	// allocation was written.
	must(t, os.Mkdir(filepath.Join(env.netnsDir, id), 0o755))
	if _, err := m.Setup(ctx, id); err == nil {
		t.Fatal("Setup succeeded over a directory")
	}
	if _, err := m.Lookup(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("allocation survived a failed Setup: %v", err)
	}
	if leak := env.snapshot(t).leakedSince(before); leak != "" {
		t.Fatalf("leak: %s", leak)
	}
}

package drivertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Env holds fixtures shared by the sandboxes of one suite run: a base rootfs
// directory (busybox-static, bash and its libraries) used as the overlay
// lower layer, and the agent binary.
type Env struct {
	Base  string // lower layer
	Agent string // host path of the static in-sandbox binary (cmd/cubicle-agent), as sandboxes get it
}

// agentBuild caches the agent binary per test binary: building it takes
// seconds and it never changes within a run.
var agentBuild struct {
	once sync.Once
	path string
	err  error
}

// NewEnv builds the fixtures, skipping tb (failing it under CI) when the
// host cannot host them (not root, no busybox-static); an agent that does
// not build fails it.
func NewEnv(tb testing.TB) *Env {
	tb.Helper()
	testenv.RequireRoot(tb, "drivertest: namespaces, overlayfs, cgroups")
	bb, err := exec.LookPath("busybox")
	if err != nil || !isStatic(bb) {
		testenv.Skip(tb, "drivertest: needs a static /bin/busybox (apt-get install busybox-static)")
	}
	agentBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "cubicle-drivertest-agent-")
		if err != nil {
			agentBuild.err = err
			return
		}
		agentBuild.path = filepath.Join(dir, "cubicle-agent")
		cmd := exec.Command("go", "build", "-o", agentBuild.path, "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentBuild.err = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if agentBuild.err != nil {
		tb.Fatalf("drivertest: agent does not build: %v", agentBuild.err)
	}
	e := &Env{Base: filepath.Join(tb.TempDir(), "base"), Agent: agentBuild.path}
	if err := buildBase(e.Base, bb); err != nil {
		tb.Fatalf("drivertest: build base rootfs: %v", err)
	}
	return e
}

func isStatic(path string) bool {
	out, err := exec.Command("ldd", path).CombinedOutput()
	return err != nil || bytes.Contains(out, []byte("not a dynamic executable"))
}

// buildBase lays out a tiny distribution: busybox applets in /bin, bash with
// the libraries ldd names, and the /etc files shells and ps expect.
func buildBase(root, busybox string) error {
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "etc", "proc", "sys", "dev", "root", "home", "var/tmp", "run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o777); err != nil {
		return err
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	os.Chmod(filepath.Join(root, "root"), 0o700)
	if err := copyFile(busybox, filepath.Join(root, "bin/busybox")); err != nil {
		return err
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(list)) {
		os.Symlink("busybox", filepath.Join(root, "bin", applet))
	}
	if bash, err := exec.LookPath("bash"); err == nil {
		os.Remove(filepath.Join(root, "bin/bash"))
		if err := copyFile(bash, filepath.Join(root, "bin/bash")); err != nil {
			return err
		}
		out, _ := exec.Command("ldd", bash).Output()
		for _, lib := range regexp.MustCompile(`(/\S+) \(0x`).FindAllSubmatch(out, -1) {
			p := string(lib[1])
			if err := copyFile(p, filepath.Join(root, p)); err != nil {
				return err
			}
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
		"etc/group":    "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
		"etc/shadow":   "root:*:19000:0:99999:7:::\n",
		"etc/hostname": "drivertest-image\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// RootFS is one sandbox's overlay: Base as lower, a fresh upper.
type RootFS struct {
	Merged, Upper string
}

// NewRootFS mounts an overlay over e.Base like the manager's storage does.
func (e *Env) NewRootFS(tb testing.TB) RootFS {
	tb.Helper()
	dir := tb.TempDir()
	r := RootFS{Merged: filepath.Join(dir, "merged"), Upper: filepath.Join(dir, "upper")}
	for _, d := range []string{r.Merged, r.Upper, filepath.Join(dir, "work")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", e.Base, r.Upper, filepath.Join(dir, "work"))
	if err := unix.Mount("overlay", r.Merged, "overlay", 0, opts); err != nil {
		tb.Fatalf("mount overlay: %v", err)
	}
	tb.Cleanup(func() { unix.Unmount(r.Merged, unix.MNT_DETACH) })
	return r
}

// NetNS is a network namespace with eth0 on a /30 shared with a host veth.
type NetNS struct {
	Path      string
	SandboxIP string
	HostIP    string
}

// NewNetNS creates a named netns and a veth pair with addresses and a
// default route (no NAT, no firewall: just enough for the host to reach the
// agent).
func NewNetNS(tb testing.TB) NetNS {
	tb.Helper()
	var suffix [4]byte
	var tag, host, sb string
	// 10.201.0.0/16 split into /30s, picked at random, skipping any a
	// live fixture already uses (two sandboxes on one /30 make the agent
	// unreachable, a flake seen about once in 40 starts).
	for try := 0; ; try++ {
		rand.Read(suffix[:])
		tag = hex.EncodeToString(suffix[:3])
		n := (int(suffix[2])<<8 | int(suffix[3])) & 0x3fff
		base := fmt.Sprintf("10.201.%d.", n>>6)
		host, sb = fmt.Sprintf("%s%d", base, (n&63)*4+1), fmt.Sprintf("%s%d", base, (n&63)*4+2)
		if !hostHasAddr(host) || try == 20 {
			break
		}
	}
	name := "cbt-" + tag
	hostIf, nsIf := "cbt"+tag+"h", "cbt"+tag+"s"
	run := func(args ...string) {
		tb.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	tb.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run("link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	tb.Cleanup(func() { exec.Command("ip", "link", "del", hostIf).Run() })
	run("link", "set", nsIf, "netns", name)
	run("addr", "add", host+"/30", "dev", hostIf)
	run("link", "set", hostIf, "up")
	run("-n", name, "link", "set", nsIf, "name", "eth0")
	run("-n", name, "addr", "add", sb+"/30", "dev", "eth0")
	run("-n", name, "link", "set", "eth0", "up")
	run("-n", name, "link", "set", "lo", "up")
	run("-n", name, "route", "add", "default", "via", host)
	return NetNS{Path: "/var/run/netns/" + name, SandboxIP: sb, HostIP: host}
}

// hostHasAddr reports whether an interface of the host already has ip.
func hostHasAddr(ip string) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if p, ok := a.(*net.IPNet); ok && p.IP.String() == ip {
			return true
		}
	}
	return false
}

// Sandbox is a started sandbox with a client for its agent.
type Sandbox struct {
	Spec   runtime.Spec
	RootFS RootFS
	Net    NetNS
	Client *agent.Client
	token  string
}

// NewID returns a fresh 32-hex-digit sandbox id.
func NewID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Start prepares and launches a sandbox on d (see Prepare and Launch).
func (e *Env) Start(tb testing.TB, d runtime.Driver, limits runtime.Limits, mutate func(*runtime.Spec)) *Sandbox {
	tb.Helper()
	s := e.Prepare(tb, limits, mutate)
	s.Launch(tb, d)
	return s
}

// Prepare makes a rootfs and netns and fills in the spec; mutate may adjust
// it.
func (e *Env) Prepare(tb testing.TB, limits runtime.Limits, mutate func(*runtime.Spec)) *Sandbox {
	tb.Helper()
	s := &Sandbox{RootFS: e.NewRootFS(tb), Net: NewNetNS(tb), token: NewID()}
	s.Spec = runtime.Spec{
		ID:          NewID(),
		RootFS:      s.RootFS.Merged,
		AgentBinary: e.Agent,
		Token:       s.token,
		Hostname:    "sbx-" + NewID()[:8],
		NetNS:       s.Net.Path,
		Limits:      limits,
	}
	if mutate != nil {
		mutate(&s.Spec)
	}
	return s
}

// Launch starts the prepared sandbox on d, waits until its agent answers,
// and stops it when tb ends.
func (s *Sandbox) Launch(tb testing.TB, d runtime.Driver) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Start(ctx, s.Spec); err != nil {
		tb.Fatalf("Start: %v", err)
	}
	tb.Cleanup(func() {
		if err := d.Stop(context.Background(), s.Spec.ID); err != nil {
			tb.Errorf("Stop: %v", err)
		}
	})
	s.Client = s.AgentClient(d, s.token)
	tb.Cleanup(s.Client.Close)
	if err := s.Client.WaitReady(ctx, 2*time.Millisecond); err != nil {
		tb.Fatalf("agent not ready: %v", err)
	}
}

// AgentClient returns a client for the sandbox's agent on d holding
// token, through d's own transport where it has one (as the manager
// dials it).
func (s *Sandbox) AgentClient(d runtime.Driver, token string) *agent.Client {
	return agent.ClientFor(d, s.Spec.ID, fmt.Sprintf("%s:%d", s.Net.SandboxIP, agent.Port), token)
}

// Exec runs command with /bin/sh in the sandbox and returns its output and
// exit code; transport errors fail tb.
func (s *Sandbox) Exec(tb testing.TB, command string) (stdout, stderr string, code int) {
	tb.Helper()
	return s.ExecShell(tb, "/bin/sh", command)
}

// ExecShell is Exec with another shell, e.g. /bin/bash.
func (s *Sandbox) ExecShell(tb testing.TB, shell, command string) (stdout, stderr string, code int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var o, e bytes.Buffer
	code, err := s.Client.Exec(ctx, protocol.ExecFrame{Command: command, Shell: shell}, &o, &e)
	if err != nil {
		tb.Fatalf("exec %q: %v (stdout %q stderr %q)", command, err, o.String(), e.String())
	}
	return o.String(), e.String(), code
}

// MustExec is Exec that fails tb on a non-zero exit and returns stdout.
func (s *Sandbox) MustExec(tb testing.TB, command string) string {
	tb.Helper()
	out, errOut, code := s.Exec(tb, command)
	if code != 0 {
		tb.Fatalf("exec %q: exit %d, stdout %q, stderr %q", command, code, out, errOut)
	}
	return out
}

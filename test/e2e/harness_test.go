// Package e2e drives a real `cubicle serve` (built as bin/cubicle by `make
// build`) with real sandboxes, a real in-process OCI registry and the
// official LangSmith client. Nothing here is mocked.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

const testKey = "e2e-admin-key"

// repoRoot finds the module root (where bin/ lives).
func repoRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// binaries returns bin/cubicle and bin/runsc, failing if `make build` has
// not produced them.
func binaries(t testing.TB) (cubicleBin, runsc string) {
	root := repoRoot(t)
	cubicleBin, runsc = filepath.Join(root, "bin", "cubicle"), filepath.Join(root, "bin", "runsc")
	for _, p := range []string{cubicleBin, runsc} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing: run `make build` first (%v)", p, err)
		}
	}
	return cubicleBin, runsc
}

// daemon is one running `cubicle serve`.
type daemon struct {
	t        testing.TB
	runtime  string
	dataDir  string
	listen   string
	Endpoint string
	Client   *cubicle.Client
	cmd      *exec.Cmd
	logs     *syncBuffer
	// extraArgs are appended to `cubicle serve` (see startDaemonArgs).
	extraArgs []string
	// bin, when set, is the cubicle binary to run instead of bin/cubicle
	// (a baseline build to compare against; see baseline_bench_test.go).
	bin string
	// extraEnv is added to the daemon's environment (see startDaemonEnv).
	extraEnv []string
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startDaemon starts `cubicle serve` on a fresh port over dataDir (created
// if empty) with the given runtime. At test end it deletes every sandbox it
// can see and stops the daemon, so nothing leaks into the next test.
func startDaemon(t testing.TB, runtime, dataDir string) *daemon {
	return startDaemonArgs(t, runtime, dataDir)
}

// startDaemonArgs is startDaemon with extra `cubicle serve` flags.
func startDaemonArgs(t testing.TB, runtime, dataDir string, extra ...string) *daemon {
	return startDaemonEnv(t, runtime, dataDir, nil, extra...)
}

// startDaemonEnv is startDaemonArgs with extra environment variables
// (NAME=value) for the daemon.
func startDaemonEnv(t testing.TB, runtime, dataDir string, env []string, extra ...string) *daemon {
	return newDaemon(t, "", runtime, dataDir, env, extra)
}

// startDaemonBin is startDaemonArgs running binary bin ("" for
// bin/cubicle).
func startDaemonBin(t testing.TB, bin, runtime, dataDir string, extra ...string) *daemon {
	return newDaemon(t, bin, runtime, dataDir, nil, extra)
}

// newDaemon starts binary bin ("" for bin/cubicle) as `cubicle serve`
// with env added to its environment and extra flags.
func newDaemon(t testing.TB, bin, runtime, dataDir string, env, extra []string) *daemon {
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	d := &daemon{t: t, runtime: runtime, dataDir: dataDir, listen: freePort(t), extraArgs: extra, extraEnv: env, bin: bin}
	d.start()
	t.Cleanup(d.shutdown)
	return d
}

// shutdown deletes every sandbox the daemon's admin can see and stops the
// daemon, so nothing leaks into the next test; a no-op once stopped.
func (d *daemon) shutdown() {
	t := d.t
	if d.cmd == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if list, err := d.Client.ListSandboxes(ctx, cubicle.ListOptions{Limit: 500}); err == nil {
		for _, sb := range list.Sandboxes {
			if err := d.Client.DeleteSandbox(ctx, sb.Name); err != nil {
				t.Errorf("cleanup: delete sandbox %s: %v", sb.Name, err)
			}
		}
	}
	d.stop()
	unmountUnder(d.dataDir)
	if t.Failed() {
		t.Logf("daemon log:\n%s", d.logs.String())
	}
}

func (d *daemon) start() {
	t := d.t
	bin, runsc := binaries(t)
	if d.bin != "" {
		bin = d.bin
	}
	d.logs = &syncBuffer{}
	args := []string{"serve", "--listen", d.listen, "--data-dir", d.dataDir, "--runtime", d.runtime, "--runsc", runsc}
	d.cmd = exec.Command(bin, append(args, d.extraArgs...)...)
	// No built-in default computer unless a test opts in with
	// CUBICLE_DEFAULT_IMAGE in its env (building it takes a minute).
	d.cmd.Env = append(append(os.Environ(), "CUBICLE_BOOTSTRAP_API_KEY="+testKey, "CUBICLE_DEFAULT_IMAGE=none"), d.extraEnv...)
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	d.Endpoint = "http://" + d.listen
	d.Client = cubicle.New(d.Endpoint, testKey)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(d.Endpoint + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not come up: %v\n%s", err, d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// unmountUnder lazily unmounts every mount below dir (deepest first), such
// as the netns runsc pins under its root, so the temp dir can be removed.
func unmountUnder(dir string) {
	data, _ := os.ReadFile("/proc/self/mountinfo")
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			points = append(points, f[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		_ = syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}

// stop ends the daemon gracefully (sandboxes keep running).
func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
	d.cmd = nil
}

// kill9 kills the daemon without warning, as a crash would.
func (d *daemon) kill9() {
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
	d.cmd = nil
}

// restart starts a new daemon process over the same data dir and port.
func (d *daemon) restart() { d.start() }

var (
	registryOnce sync.Once
	registryHost string
	imageRefs    = map[string]string{}
)

// testImage returns the ref of the busybox+bash test image pushed to an
// in-process registry shared by the test binary.
func testImage(t testing.TB) string {
	registryOnce.Do(func() {
		registryHost = imagetest.StartRegistry(nopCleanup{t})
		imageRefs["busybox"] = imagetest.Push(t, registryHost, "cubicle/busybox:e2e", imagetest.BusyboxImage(t))
	})
	if registryHost == "" {
		t.Fatal("test registry failed to start")
	}
	return imageRefs["busybox"]
}

// nopCleanup keeps the shared registry alive for the whole test binary
// instead of the first test that asked for it.
type nopCleanup struct{ testing.TB }

func (nopCleanup) Cleanup(func()) {}

// readySnapshot creates a snapshot of ref and waits until it is ready.
func readySnapshot(t testing.TB, c *cubicle.Client, name, ref string) *protocol.Snapshot {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sn, err := c.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: name, DockerImage: ref, FSCapacityBytes: 1 << 30})
	if err != nil {
		t.Fatalf("create snapshot: %v", err)
	}
	sn, err = c.WaitSnapshot(ctx, sn.ID, nil)
	if err != nil {
		t.Fatalf("wait snapshot: %v", err)
	}
	return sn
}

// shareWithWorkspace lets every member of c's workspace boot snapshot id
// (snapshots are private to their creator and the admins until shared).
func shareWithWorkspace(t testing.TB, c *cubicle.Client, id string) {
	t.Helper()
	if _, err := c.Share(context.Background(), cubicle.ShareSnapshot, id, protocol.ShareRequest{Workspace: true, Access: "use"}); err != nil {
		t.Fatalf("share snapshot %s with the workspace: %v", id, err)
	}
}

func int64p(v int64) *int64 { return &v }

// newSandbox creates a sandbox from snapshot id and waits for it.
func newSandbox(t testing.TB, c *cubicle.Client, snapshotID string, mutate func(*protocol.CreateSandboxRequest)) *protocol.Sandbox {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req := protocol.CreateSandboxRequest{SnapshotID: snapshotID, Timeout: int64p(90)}
	if mutate != nil {
		mutate(&req)
	}
	sb, err := c.CreateSandbox(ctx, req)
	if err != nil {
		t.Fatalf("create sandbox: %v", err)
	}
	if sb.Status != protocol.StatusReady {
		t.Fatalf("sandbox %s is %s (%s)", sb.Name, sb.Status, sb.StatusMessage)
	}
	return sb
}

// run executes command in sandbox name through the WebSocket exec path.
func run(t testing.TB, c *cubicle.Client, name, command string) (stdout, stderr string, code int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	code, err := c.Exec(ctx, name, cubicle.ExecRequest{Command: command, Shell: "/bin/sh", Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("exec %q in %s: %v", command, name, err)
	}
	return out.String(), errb.String(), code
}

// mustRun runs command and fails the test unless it exits 0.
func mustRun(t testing.TB, c *cubicle.Client, name, command string) string {
	out, errs, code := run(t, c, name, command)
	if code != 0 {
		t.Fatalf("%q exited %d: stdout=%q stderr=%q", command, code, out, errs)
	}
	return out
}

func runtimes() []string { return []string{"gvisor", "namespace"} }

// withMicroVM is runtimes() and the microvm runtime: the suites it runs
// (isolation, branching, volumes) boot a VM under TCG in about 2.8 s, too
// slow to add it to every test.
func withMicroVM() []string { return append(runtimes(), "microvm") }

func sh(t testing.TB, name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

var _ = fmt.Sprintf

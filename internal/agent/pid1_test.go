package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// helperEnv makes the test binary act as `cubicle agent` (see TestMain), so
// the PID 1 code path runs for real inside a new PID namespace.
const helperEnv = "CUBICLE_AGENT_TEST_LISTEN"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		token, err := ReadToken(os.Stdin)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		if err := Run(context.Background(), addr, token, log); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPID1 runs the agent as PID 1 of a fresh PID namespace and checks that
// orphans are reaped while the exit codes of concurrent commands still reach
// their own sessions, and that SIGTERM stops the agent.
func TestPID1(t *testing.T) {
	testenv.RequireRoot(t, "for a PID namespace")
	testenv.RequireTool(t, "unshare")
	addr := freeAddr(t)
	cmd := exec.Command("unshare", "--pid", "--fork", os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+addr)
	cmd.Stdin = strings.NewReader(testToken) // the token, as drivers hand it over
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	go io.Copy(io.Discard, bufio.NewReader(stderr))
	c := NewClient(addr, testToken)
	defer c.Close()
	ctx := ctxT(t)
	if err := c.WaitReady(ctx, 2*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The token was read from stdin and is nowhere in the environment.
	out, _, _, err := run(t, c, protocol.ExecFrame{Command: "echo $$ $PPID; env | grep -c " + testToken + " || true", CloseStdin: true})
	if err != nil || !strings.HasSuffix(out, " 1\n0\n") {
		t.Fatalf("inside: %q %v", out, err)
	}

	// Orphans: each command leaves a background child that is reparented to
	// PID 1 when the shell exits.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, code, err := run(t, c, protocol.ExecFrame{Command: fmt.Sprintf("(sleep 0.05 &); exit %d", i), CloseStdin: true})
			if err != nil || code != i {
				t.Errorf("command %d: code %d err %v", i, code, err)
			}
		}()
	}
	wg.Wait()
	agentPid := childOf(t, cmd.Process.Pid)
	time.Sleep(300 * time.Millisecond)
	if z := zombieChildren(agentPid); len(z) > 0 {
		t.Fatalf("zombies left: %v", z)
	}

	if err := syscall.Kill(agentPid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("agent exit: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent ignored SIGTERM")
	}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// zombieChildren lists the children of pid that are zombies.
func zombieChildren(pid int) []string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var z []string
	for _, c := range strings.Fields(string(b)) {
		st, err := os.ReadFile("/proc/" + c + "/stat")
		if err == nil && strings.Contains(string(st), ") Z ") {
			z = append(z, c)
		}
	}
	return z
}

// childOf returns the only child of pid (the agent forked by unshare).
func childOf(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("children of %d: %q", pid, b)
	}
	return n
}

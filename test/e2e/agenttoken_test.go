package e2e

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// agentToken reads sandbox id's current agent token from the daemon's
// database (read-only; the daemon keeps running).
func agentToken(t testing.TB, d *daemon, id string) string {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(d.dataDir, "cubicle.db")+"?mode=ro&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var tok string
	if err := db.QueryRow(`SELECT token FROM sandboxes WHERE id=?`, id).Scan(&tok); err != nil || tok == "" {
		t.Fatalf("token of sandbox %s: %q, %v", id, tok, err)
	}
	return tok
}

// agentAt returns the address of sandbox name's agent, as the sandbox sees
// its own eth0 address.
func agentAt(t testing.TB, d *daemon, name string) string {
	t.Helper()
	out := mustRun(t, d.Client, name, "ip -4 -o addr show dev eth0")
	for _, f := range strings.Fields(out) {
		if ip, _, err := net.ParseCIDR(f); err == nil {
			return net.JoinHostPort(ip.String(), strconv.Itoa(agent.Port))
		}
	}
	t.Fatalf("no address in %q", out)
	return ""
}

// wantAgentAuth checks whether the agent at addr accepts token: nil error
// when it should, 401 when it should not.
func wantAgentAuth(t testing.TB, addr, token string, accepted bool, what string) {
	t.Helper()
	c := agent.NewClient(addr, token)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := c.Health(ctx)
	var he *agent.HTTPError
	switch {
	case accepted && err != nil:
		t.Fatalf("%s: refused: %v", what, err)
	case !accepted && !(errors.As(err, &he) && he.Status == http.StatusUnauthorized):
		t.Fatalf("%s: %v, want 401", what, err)
	}
}

// wantNoAgentOnNetwork checks that nothing answers at addr, a microVM's
// agent address on the sandbox's network: its agent serves the daemon
// over the VM's virtio-serial port only.
func wantNoAgentOnNetwork(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		c.Close()
		t.Fatalf("something listens at the microVM's agent address %s", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the microVM's agent address %s: %v, want it refused", addr, err)
	}
}

// TestAgentTokenHiddenAndRotated attacks the agent token on each runtime:
// root inside reads every process's environment and argv and must not
// find it; after a stop/start the previous instance's token must no longer
// open the agent (every start gets a fresh one); and a daemon restart must
// still re-adopt the sandbox with the rotated token, which it persists.
func TestAgentTokenHiddenAndRotated(t *testing.T) {
	ref := testImage(t)
	ctx := context.Background()
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			sn := readySnapshot(t, d.Client, "token", ref)
			sb := newSandbox(t, d.Client, sn.ID, nil)
			tok1, addr1 := agentToken(t, d, sb.ID), agentAt(t, d, sb.Name)
			wantAgentAuth(t, addr1, tok1, true, "the recorded token")
			out := mustRun(t, d.Client, sb.Name, "id -u; cat /proc/1/environ /proc/1/cmdline; for p in /proc/[0-9]*; do cat $p/environ; done 2>/dev/null")
			if !strings.HasPrefix(out, "0\n") || strings.Contains(out, tok1) {
				t.Fatalf("root inside reads the agent token (or is not root):\n%s", out)
			}
			if err := d.Client.StopSandbox(ctx, sb.Name); err != nil {
				t.Fatal(err)
			}
			if err := d.Client.StartSandbox(ctx, sb.Name); err != nil {
				t.Fatal(err)
			}
			tok2, addr2 := agentToken(t, d, sb.ID), agentAt(t, d, sb.Name)
			if tok2 == tok1 {
				t.Fatal("the token did not change across stop/start")
			}
			wantAgentAuth(t, addr2, tok1, false, "the token from before the stop")
			wantAgentAuth(t, addr2, tok2, true, "the new token")
			d.stop()
			d.restart()
			if out := mustRun(t, d.Client, sb.Name, "echo adopted"); out != "adopted\n" {
				t.Fatalf("after a daemon restart: %q", out)
			}
			if !strings.Contains(d.logs.String(), "re-adopted running sandbox") {
				t.Fatalf("the restarted daemon did not re-adopt the sandbox:\n%s", d.logs.String())
			}
		})
	}
}

// TestMemoryForkGetsOwnAgentToken: a branch restored from a memory
// snapshot wakes up with its parent's token in its agent's memory; the
// daemon must replace it before handing the branch out, so the parent's
// token does not open the branch, nor the branch's the parent.
func TestMemoryForkGetsOwnAgentToken(t *testing.T) {
	ref := testImage(t)
	d := startDaemon(t, "gvisor", "")
	sn := readySnapshot(t, d.Client, "base", ref)
	p := newSandbox(t, d.Client, sn.ID, nil)
	fork, err := d.Client.Fork(context.Background(), p.Name, protocol.ForkRequest{Count: 2, IncludeMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	ptok, paddr := agentToken(t, d, p.ID), agentAt(t, d, p.Name)
	seen := map[string]string{ptok: p.Name}
	for _, b := range fork.Sandboxes {
		btok, baddr := agentToken(t, d, b.ID), agentAt(t, d, b.Name)
		if who, dup := seen[btok]; dup {
			t.Fatalf("branch %s shares its agent token with %s", b.Name, who)
		}
		seen[btok] = b.Name
		wantAgentAuth(t, baddr, btok, true, "the branch's own token")
		wantAgentAuth(t, baddr, ptok, false, "the parent's token on the branch")
		wantAgentAuth(t, paddr, btok, false, "the branch's token on the parent")
	}
	wantAgentAuth(t, paddr, ptok, true, "the parent's own token")
}

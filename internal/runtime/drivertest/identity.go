package drivertest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// testIdentity gives a running sandbox another hostname and machine-id
// the way the manager does at a warm-pool claim (through the agent where
// the driver says it can, runtime.AgentIdentifier, else the driver's
// runtime.Identifier) and checks both inside. Where the agent holds the
// capability for it, commands must not: a root command cannot set the
// hostname, and CAP_SYS_ADMIN is in none of its sets.
func testIdentity(t *testing.T, env *Env, d runtime.Driver) {
	ai, agentSide := d.(runtime.AgentIdentifier)
	agentSide = agentSide && ai.AgentSetsIdentity()
	id, driverSide := d.(runtime.Identifier)
	if !agentSide && !driverSide {
		t.Skipf("the %s driver cannot change a running sandbox's identity (no warm pools on it)", d.Name())
	}
	s := env.Start(t, d, runtime.Limits{}, nil)
	host, mid := "claimed-"+NewID()[:8], NewID()[:32]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	var err error
	if agentSide {
		err = s.Client.SetIdentity(ctx, host, mid)
	} else {
		err = id.SetIdentity(ctx, s.Spec.ID, host, mid)
	}
	if err != nil {
		t.Fatalf("set identity: %v", err)
	}
	t.Logf("identity set in %v (agent: %v)", time.Since(start), agentSide)
	if got := s.MustExec(t, "hostname; cat /etc/machine-id; grep -c "+host+" /etc/hosts"); got != host+"\n"+mid+"\n1\n" {
		t.Fatalf("after set identity: %q, want hostname %s, machine-id %s and one hosts line", got, host, mid)
	}
	if !agentSide || d.Name() == "microvm" {
		return // commands of a microVM are root of their own kernel
	}
	if out, _, code := s.Exec(t, "hostname evil"); code == 0 {
		t.Errorf("a root command set the hostname: %q", out)
	}
	caps := s.MustExec(t, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status")
	for _, line := range strings.Split(strings.TrimSpace(caps), "\n") {
		f := strings.Fields(line)
		v, err := strconv.ParseUint(f[len(f)-1], 16, 64)
		if err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		if v&(1<<21) != 0 { // CAP_SYS_ADMIN
			t.Errorf("a command holds CAP_SYS_ADMIN: %s", line)
		}
	}
	if got := s.MustExec(t, "hostname"); got != host+"\n" {
		t.Errorf("hostname is %q after a command tried to change it", got)
	}
}

// testBackground boots a sandbox at the background CPU share (what a
// warm-pool instance gets) and checks its host cgroup's share before and
// after SetBackground gives it the normal one, as a claim does.
func testBackground(t *testing.T, env *Env, d runtime.Driver) {
	w, ok := d.(runtime.CPUWeighter)
	if !ok {
		t.Skipf("the %s driver places sandboxes in no host cgroup", d.Name())
	}
	s := env.Start(t, d, runtime.Limits{Background: true}, nil)
	share := func() string {
		t.Helper()
		for _, pat := range []string{"/sys/fs/cgroup/cpu/*/" + s.Spec.ID + "/cpu.shares", "/sys/fs/cgroup/*/" + s.Spec.ID + "/cpu.weight"} {
			if m, _ := filepath.Glob(pat); len(m) == 1 {
				b, err := os.ReadFile(m[0])
				if err != nil {
					t.Fatal(err)
				}
				return filepath.Base(m[0]) + "=" + strings.TrimSpace(string(b))
			}
		}
		t.Fatalf("no cpu cgroup of sandbox %s", s.Spec.ID)
		return ""
	}
	if got := share(); got != "cpu.shares=2" && got != "cpu.weight=1" {
		t.Fatalf("booted in the background: %s, want the lowest share", got)
	}
	if err := w.SetBackground(context.Background(), s.Spec.ID, false); err != nil {
		t.Fatal(err)
	}
	if got := share(); got != "cpu.shares=1024" && got != "cpu.weight=100" {
		t.Fatalf("after SetBackground(false): %s, want the normal share", got)
	}
	s.MustExec(t, "true")
}

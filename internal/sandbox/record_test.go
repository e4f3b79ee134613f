package sandbox

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/sandbox/sandboxtest"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// withRecorder wires a fake Recorder into the env's manager.
func withRecorder(r *sandboxtest.Recorder) envOption {
	return func(c *Config) { c.Recorder = r }
}

// timeline renders a sandbox's recorded events as "actor:type[:reason]".
func timeline(t *testing.T, r *sandboxtest.Recorder, id string) string {
	t.Helper()
	var out []string
	for _, e := range r.Events(id) {
		if e.Kind != protocol.KindLifecycle {
			t.Fatalf("event %+v is not lifecycle", e)
		}
		s := e.Actor + ":" + e.Type
		b, _ := json.Marshal(e.Data)
		var d struct{ Reason, By string }
		_ = json.Unmarshal(b, &d)
		if d.Reason != "" {
			s += ":" + d.Reason
		}
		if d.By != "" {
			s += ":" + d.By
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// TestLifecycleEvents drives a sandbox through its life and checks the
// record gets each transition once, in order, with who caused it and why
// it stopped: API calls as their caller, the watcher and reaper as system.
func TestLifecycleEvents(t *testing.T) {
	rec := &sandboxtest.Recorder{}
	e := newEnv(t, withRecorder(rec))
	ctx := as(member)
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "life", IdleTTLSeconds: ptr(int64(2))})
	if err != nil {
		t.Fatal(err)
	}
	rc := protocol.RunConfig{EnvVars: map[string]string{"TOKEN": "s3cret-value"}}
	if _, err := e.m.UpdateSandbox(ctx, "life", protocol.UpdateSandboxRequest{Name: ptr("life2"), IdleTTLSeconds: ptr(int64(4)), RunConfig: &rc}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StopSandbox(ctx, "life2"); err != nil {
		t.Fatal(err)
	}
	c, err := e.m.Dataplane(WithRequestKind(ctx, "exec_ws"), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	c.Release()
	e.driver.Kill(runtimeID(sb.ID))
	eventually(t, "the watcher", func() bool { return e.get(t, sb.ID).Status == protocol.StatusStopped })
	if _, err := e.m.StartSandbox(ctx, "life2"); err != nil {
		t.Fatal(err)
	}
	e.backdate(sb.ID, time.Minute)
	e.m.Reap(context.Background())
	if err := e.m.DeleteSandbox(ctx, "life2"); err != nil {
		t.Fatal(err)
	}
	want := "bob:created bob:started bob:renamed bob:policy_changed bob:stopped:api bob:woken:exec_ws " +
		"system:stopped:crash bob:started system:stopped:idle bob:deleted:api"
	if got := timeline(t, rec, sb.ID); got != want {
		t.Fatalf("timeline:\n got %s\nwant %s", got, want)
	}
	evs := rec.Events(sb.ID)
	all, _ := json.Marshal(evs)
	if strings.Contains(string(all), "s3cret-value") {
		t.Fatalf("a run_config value is in the record: %s", all)
	}
	pc, _ := json.Marshal(evs[3].Data)
	if want := `{"fields":["idle_ttl_seconds","run_config"],"idle_ttl_seconds":[2,4]}`; string(pc) != want {
		t.Fatalf("policy change = %s, want %s", pc, want)
	}
	cd, _ := json.Marshal(evs[0].Data)
	if !strings.Contains(string(cd), `"snapshot_id":"snap-default"`) || !strings.Contains(string(cd), `"mem_bytes":`) {
		t.Fatalf("created data = %s", cd)
	}
}

// TestForkAndResetEvents checks a fork is recorded as captured and forked
// on the parent (naming its branches) and as forked on each branch (naming
// its parent), and a reset as stopped, reset, started.
func TestForkAndResetEvents(t *testing.T) {
	rec := &sandboxtest.Recorder{}
	e := newEnv(t, withRecorder(rec))
	ctx := as(member)
	parent := e.create(t, member, "p")
	res, err := e.m.Fork(ctx, "p", protocol.ForkRequest{Count: 1, Names: []string{"b1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.ResetSandbox(ctx, "p", ""); err != nil {
		t.Fatal(err)
	}
	if got, want := timeline(t, rec, parent.ID), "bob:created bob:started bob:captured bob:forked bob:stopped:reset bob:reset bob:started"; got != want {
		t.Fatalf("parent timeline:\n got %s\nwant %s", got, want)
	}
	child := res.Sandboxes[0]
	if got, want := timeline(t, rec, child.ID), "bob:created bob:started bob:forked"; got != want {
		t.Fatalf("branch timeline:\n got %s\nwant %s", got, want)
	}
	pf, _ := json.Marshal(rec.Events(parent.ID)[3].Data)
	cf, _ := json.Marshal(rec.Events(child.ID)[2].Data)
	if !strings.Contains(string(pf), `"children":[{"id":"`+child.ID+`","name":"b1"}]`) || !strings.Contains(string(cf), `"parent":{"id":"`+parent.ID+`","name":"p"}`) {
		t.Fatalf("forked data: parent %s, branch %s", pf, cf)
	}
}

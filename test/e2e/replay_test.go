package e2e

import (
	"context"
	"testing"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestAuditDiffAndReplay forks a sandbox with a history, gives each
// branch its own commands, and checks that the branches' histories share
// the parent's steps and then diverge, that replaying a branch from the
// history's starting snapshot re-runs everything with the same outcomes,
// and that a command whose output differs is reported as such.
func TestAuditDiffAndReplay(t *testing.T) {
	d := startDaemon(t, "namespace", "")
	c := d.Client
	ctx := context.Background()
	sn := readySnapshot(t, c, "replay", testImage(t))
	p := newSandbox(t, c, sn.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "parent" })
	mustRun(t, c, p.Name, "echo base > /tmp/f")
	if _, _, code := run(t, c, p.Name, "exit 3"); code != 3 {
		t.Fatalf("exit 3: %d", code)
	}
	if _, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 2, Names: []string{"b1", "b2"}}); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, "b1", "cat /tmp/f; echo one")
	run(t, c, "b2", "echo two; false")

	diff, err := c.AuditDiff(ctx, "b1", "b2")
	if err != nil {
		t.Fatal(err)
	}
	if len(diff.Common) != 2 || diff.Common[0].Command != "echo base > /tmp/f" || diff.Common[1].ExitCode == nil || *diff.Common[1].ExitCode != 3 {
		t.Fatalf("common steps: %+v", diff.Common)
	}
	if len(diff.OnlyA) != 1 || diff.OnlyA[0].Command != "cat /tmp/f; echo one" || len(diff.OnlyB) != 1 ||
		diff.OnlyB[0].ExitCode == nil || *diff.OnlyB[0].ExitCode != 1 {
		t.Fatalf("divergent steps: a %+v, b %+v", diff.OnlyA, diff.OnlyB)
	}

	res, err := c.Replay(ctx, "b1", protocol.ReplayRequest{Name: "b1-again"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Matched || len(res.Steps) != 3 || res.Sandbox == nil || res.Sandbox.Name != "b1-again" {
		t.Fatalf("replay of b1: %+v", res)
	}
	for _, s := range res.Steps {
		if !s.ExitMatched || !s.OutputMatched || s.Step == 0 {
			t.Errorf("replayed step %+v", s)
		}
	}
	// The replay has a record of its own, with the same commands.
	again, err := c.AuditDiff(ctx, "b1", "b1-again")
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Common) != 3 || len(again.OnlyA)+len(again.OnlyB) != 0 {
		t.Fatalf("b1 vs its replay: %+v", again)
	}

	// A command whose output changes between runs is reported.
	mustRun(t, c, "b2", "cat /proc/sys/kernel/random/uuid")
	hist, err := c.Audit(ctx, "b2", cubicle.AuditOptions{Kinds: []string{protocol.KindCommand}})
	if err != nil {
		t.Fatal(err)
	}
	last := hist.Items[len(hist.Items)-1].Step
	res, err = c.Replay(ctx, "b2", protocol.ReplayRequest{Steps: protocol.ReplaySteps{IDs: []int64{last}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched || len(res.Steps) != 1 || !res.Steps[0].ExitMatched || res.Steps[0].OutputMatched {
		t.Fatalf("replay of a random command: %+v", res)
	}
	if _, err := c.Replay(ctx, "b2", protocol.ReplayRequest{Steps: protocol.ReplaySteps{IDs: []int64{99999}}}); err == nil {
		t.Fatal("replay of an unknown step was accepted")
	}
}

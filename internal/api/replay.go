package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// Comparing and re-running histories (internal/record.History): a
// sandbox's history is its commands in order, a fork branch's beginning
// with its parent's up to the fork.

// replayTimeout bounds a replayed command that had no timeout of its own.
const replayTimeout = int64(600)

// registerReplayRoutes serves audit diff and replay (with a recorder only).
func (s *Server) registerReplayRoutes() {
	if s.rec == nil {
		return
	}
	for _, p := range prefixes {
		s.handle("GET "+p+"/audit/diff", jsonHandler(http.StatusOK, nil, s.auditDiff))
		s.handle("POST "+p+"/boxes/{name}/replay", jsonHandler(http.StatusCreated, nil, s.replay))
	}
}

// auditDiff serves GET …/audit/diff?a=NAME&b=NAME: where two sandboxes'
// histories diverge. Both must be visible to the caller.
func (s *Server) auditDiff(r *http.Request, _ none) (protocol.AuditDiff, error) {
	q := r.URL.Query()
	for k := range q {
		if k != "a" && k != "b" {
			return protocol.AuditDiff{}, errdefs.Field(k, "unknown query parameter; audit diff takes a and b")
		}
	}
	hs := make([][]protocol.HistoryStep, 2)
	for i, k := range []string{"a", "b"} {
		name := q.Get(k)
		if name == "" {
			return protocol.AuditDiff{}, errdefs.Field(k, "is required: a sandbox name or id")
		}
		sb, err := s.mgr.GetSandbox(r.Context(), name)
		if err != nil {
			return protocol.AuditDiff{}, err
		}
		if hs[i], _, err = s.rec.History(r.Context(), sb.ID); err != nil {
			return protocol.AuditDiff{}, err
		}
	}
	n := record.Diverge(hs[0], hs[1])
	return protocol.AuditDiff{A: q.Get("a"), B: q.Get("b"), Common: nonNil(hs[0][:n]), OnlyA: nonNil(hs[0][n:]), OnlyB: nonNil(hs[1][n:])}, nil
}

func nonNil(s []protocol.HistoryStep) []protocol.HistoryStep {
	if s == nil {
		return []protocol.HistoryStep{}
	}
	return s
}

// replay serves POST …/boxes/{name}/replay: a new sandbox from the
// history's starting snapshot (or from_snapshot) re-runs the selected
// commands in order, each recorded afresh in the new sandbox's record,
// and the answer says per step whether exit and output matched.
//
// What a command got from its caller besides its run config is not
// replayed: env values (the record keeps names only) and stdin.
func (s *Server) replay(r *http.Request, req protocol.ReplayRequest) (protocol.ReplayResult, error) {
	ctx := r.Context()
	src, err := s.mgr.GetSandbox(ctx, r.PathValue("name"))
	if err != nil {
		return protocol.ReplayResult{}, err
	}
	hist, root, err := s.rec.History(ctx, src.ID)
	if err != nil {
		return protocol.ReplayResult{}, err
	}
	steps, from, err := replaySteps(hist, root, src, req.Steps)
	if err != nil {
		return protocol.ReplayResult{}, err
	}
	if req.FromSnapshot != "" {
		from = req.FromSnapshot
	}
	if from == "" {
		return protocol.ReplayResult{}, errdefs.Field("from_snapshot", "the history's starting snapshot is unknown: name one")
	}
	wait := true
	create := protocol.CreateSandboxRequest{Name: req.Name, WaitForReady: &wait,
		VCPUs: &src.VCPUs, MemBytes: &src.MemBytes, RunConfig: src.RunConfig, ProxyConfig: src.ProxyConfig}
	if _, err := uuid.Parse(from); err == nil {
		create.SnapshotID = from
	} else {
		create.SnapshotName = from
	}
	sb, err := s.mgr.CreateSandbox(ctx, create)
	if err != nil {
		return protocol.ReplayResult{}, fmt.Errorf("create the replay sandbox: %w", err)
	}
	newSteps := make([]int64, len(steps))
	for i, st := range steps {
		if newSteps[i], err = s.rerun(ctx, sb.ID, st); err != nil {
			return protocol.ReplayResult{}, fmt.Errorf("replay step %d (%q): %w", st.Step, st.Command, err)
		}
	}
	return s.compareReplay(ctx, sb, steps, newSteps)
}

// replaySteps selects the steps of hist to replay and the snapshot they
// start from: all of it from the root snapshot, or src's own steps ids
// from src's snapshot.
func replaySteps(hist []protocol.HistoryStep, root string, src *store.Sandbox, sel protocol.ReplaySteps) ([]protocol.HistoryStep, string, error) {
	if sel.All || len(sel.IDs) == 0 {
		return hist, root, nil
	}
	var out []protocol.HistoryStep
	for _, id := range sel.IDs {
		i := slices.IndexFunc(hist, func(h protocol.HistoryStep) bool { return h.SandboxID == src.ID && h.Step == id })
		if i < 0 {
			return nil, "", errdefs.Field("steps", "%d is not a command step of sandbox %s's own record", id, src.Name)
		}
		out = append(out, hist[i])
	}
	return out, src.SnapshotID, nil
}

// rerun runs step st's command in sandbox id, recorded there, and returns
// its new step. The command's failure is its outcome, not an error.
func (s *Server) rerun(ctx context.Context, id string, st protocol.HistoryStep) (int64, error) {
	dp, err := s.mgr.Dataplane(ctx, id)
	if err != nil {
		return 0, err
	}
	defer dp.Release()
	timeout := st.TimeoutSeconds
	if timeout <= 0 {
		timeout = replayTimeout
	}
	f := protocol.ExecFrame{Type: protocol.FrameExecute, Command: st.Command, Shell: st.Shell, CommandID: uuid.NewString(),
		TimeoutSeconds: &timeout, CloseStdin: true, RunConfig: &protocol.RunConfig{User: st.User, WorkDir: st.Cwd}}
	if err := layerExec(dp.RunConfig, &f); err != nil {
		return 0, err
	}
	outw, errw, step, ended := s.recordCommand(ctx, id, dp, &f, nil, "replay", io.Discard, io.Discard)
	code, err := dp.Agent.Exec(ctx, f, outw, errw)
	ended(ctx, code, err)
	return step, ctx.Err()
}

// compareReplay answers a replay: each original step against the new
// sandbox's step, by outcome and by recorded output.
func (s *Server) compareReplay(ctx context.Context, sb *store.Sandbox, steps []protocol.HistoryStep, newSteps []int64) (protocol.ReplayResult, error) {
	got, _, err := s.rec.History(ctx, sb.ID)
	if err != nil {
		return protocol.ReplayResult{}, err
	}
	res := protocol.ReplayResult{Matched: true, Steps: make([]protocol.ReplayStepResult, len(steps))}
	for i, st := range steps {
		sr := protocol.ReplayStepResult{Source: st, Step: newSteps[i]}
		if j := slices.IndexFunc(got, func(h protocol.HistoryStep) bool { return h.Step == newSteps[i] }); j >= 0 {
			sr.ExitCode, sr.Error = got[j].ExitCode, got[j].Error
			sr.ExitMatched = record.SameOutcome(st, got[j])
		}
		a, errA := s.rec.Step(ctx, st.SandboxID, st.Step)
		b, errB := s.rec.Step(ctx, sb.ID, newSteps[i])
		sr.OutputMatched = errA == nil && errB == nil && sameOutput(a.Stdout, b.Stdout) && sameOutput(a.Stderr, b.Stderr)
		res.Matched = res.Matched && sr.ExitMatched && sr.OutputMatched
		res.Steps[i] = sr
	}
	cur, err := s.mgr.GetSandbox(ctx, sb.ID)
	if err != nil {
		return protocol.ReplayResult{}, err
	}
	out := s.sandboxJSON(cur)
	res.Sandbox = &out
	return res, nil
}

// sameOutput compares two recorded streams (absent is empty).
func sameOutput(a, b *protocol.CommandOutput) bool {
	var zero protocol.CommandOutput
	if a == nil {
		a = &zero
	}
	if b == nil {
		b = &zero
	}
	return *a == *b
}

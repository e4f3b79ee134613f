package record

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// maxLineage bounds how many ancestors a history follows (a chain of
// forks of forks).
const maxLineage = 16

// historyKinds are the events a history is built from.
var historyKinds = []string{protocol.KindLifecycle, protocol.KindCommand, protocol.KindFile}

// History is sandboxID's commands in order, its lineage included: a fork
// branch's history begins with its parent's history up to the fork, so
// two branches of one parent share a prefix. Snapshot is the snapshot the
// history starts from (the root ancestor's creation snapshot), the state
// a replay of all of it begins in.
func (r *Recorder) History(ctx context.Context, sandboxID string) (steps []protocol.HistoryStep, snapshot string, err error) {
	return r.history(ctx, sandboxID, 0, maxLineage)
}

// history is History of the steps before seq limit (0: all).
func (r *Recorder) history(ctx context.Context, sandboxID string, limit int64, depth int) ([]protocol.HistoryStep, string, error) {
	evs, err := r.Events(ctx, store.AuditQuery{SandboxID: sandboxID, Kinds: historyKinds})
	if err != nil {
		return nil, "", err
	}
	if len(evs) == 0 {
		return nil, "", fmt.Errorf("record of sandbox %s: %w", sandboxID, errdefs.ErrNotFound)
	}
	var own []protocol.HistoryStep
	at := map[int64]int{} // step → index in own
	var inherited []protocol.HistoryStep
	snapshot := ""
	for _, e := range evs {
		if limit > 0 && e.Seq >= limit {
			break
		}
		switch e.Type {
		case protocol.EventCreated:
			var d struct {
				SnapshotID string `json:"snapshot_id"`
			}
			json.Unmarshal(e.Data, &d)
			snapshot = d.SnapshotID
		case protocol.EventForked:
			var d struct {
				Parent *protocol.SandboxRef `json:"parent"`
			}
			if json.Unmarshal(e.Data, &d) != nil || d.Parent == nil || depth == 0 || len(own) > 0 {
				continue
			}
			fork, err := r.forkSeq(ctx, d.Parent.ID, sandboxID)
			if err != nil {
				continue // the parent's record is gone: the branch's own history stands alone
			}
			parent, root, err := r.history(ctx, d.Parent.ID, fork, depth-1)
			if err == nil {
				inherited, snapshot = parent, root
			}
		case protocol.EventCommandStarted:
			var d startedData
			json.Unmarshal(e.Data, &d)
			at[e.Seq] = len(own)
			own = append(own, protocol.HistoryStep{SandboxID: sandboxID, Step: e.Seq, Command: d.Command, Shell: d.Shell,
				User: d.User, Cwd: d.Cwd, TimeoutSeconds: d.TimeoutSeconds})
		case protocol.EventCommandExited:
			if i, ok := at[e.Step]; ok {
				var d exitedData
				json.Unmarshal(e.Data, &d)
				own[i].ExitCode = d.ExitCode
				switch {
				case d.Lost != "":
					own[i].Error = "lost: " + d.Lost
				case d.Killed != "":
					own[i].Error = "killed: " + d.Killed
				default:
					own[i].Error = d.Error
				}
			}
		default:
			if i, ok := at[e.Step]; ok && e.Kind == protocol.KindFile {
				own[i].Files = append(own[i].Files, e.Data)
			}
		}
	}
	return append(inherited, own...), snapshot, nil
}

// forkSeq is the seq of the forked event in parentID's record that made
// child.
func (r *Recorder) forkSeq(ctx context.Context, parentID, child string) (int64, error) {
	evs, err := r.Events(ctx, store.AuditQuery{SandboxID: parentID, Kinds: []string{protocol.KindLifecycle}})
	if err != nil {
		return 0, err
	}
	for _, e := range evs {
		if e.Type != protocol.EventForked {
			continue
		}
		var d struct {
			Children []protocol.SandboxRef `json:"children"`
		}
		json.Unmarshal(e.Data, &d)
		for _, c := range d.Children {
			if c.ID == child {
				return e.Seq, nil
			}
		}
	}
	return 0, fmt.Errorf("fork of %s in %s's record: %w", child, parentID, errdefs.ErrNotFound)
}

// Diverge is how many leading steps histories a and b share: the same
// step of a common ancestor, or the same command (shell, user, cwd) with
// the same outcome.
func Diverge(a, b []protocol.HistoryStep) int {
	n := 0
	for n < len(a) && n < len(b) && sameStep(a[n], b[n]) {
		n++
	}
	return n
}

func sameStep(a, b protocol.HistoryStep) bool {
	if a.SandboxID == b.SandboxID && a.Step == b.Step {
		return true
	}
	return a.Command == b.Command && a.Shell == b.Shell && a.User == b.User && a.Cwd == b.Cwd && SameOutcome(a, b)
}

// SameOutcome reports whether two steps ended alike: the same exit code,
// or the same way of ending without one.
func SameOutcome(a, b protocol.HistoryStep) bool {
	sameExit := (a.ExitCode == nil) == (b.ExitCode == nil) && (a.ExitCode == nil || *a.ExitCode == *b.ExitCode)
	return sameExit && a.Error == b.Error
}

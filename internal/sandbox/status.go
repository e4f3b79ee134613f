package sandbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Status is a sandbox's lifecycle state, owned by the manager. Its values
// are the protocol's strings, so the store and the API carry them as is;
// nothing outside transition assigns a record's status.
type Status string

// The lifecycle states. Gone is the end: the record is deleted.
//
//	          ┌──────────────┐ boot ok  ┌───────┐  stop/idle/died  ┌─────────┐
//	create ──▶│ provisioning ├─────────▶│ ready │◀────────────────▶│ stopped │
//	          └──┬────────▲──┘          └───┬───┘     start        └────┬────┘
//	   boot fails│        │start            │                           │
//	          ┌──▼──────┐ │                 │ delete                    │ delete/TTL
//	          │ failed  ├─┘                 ▼                           │
//	          └──┬──────┘  delete     ┌──────────┐     ◀────────────────┘
//	             └───────────────────▶│ deleting ├──▶ gone (record removed)
//	                                  └──────────┘
//
// A failed restart of a stopped sandbox leaves it stopped (with why).
// To add a state (paused, archived), add its constant, its row in
// transitions, and the operations that accept it in ops.
const (
	Provisioning Status = protocol.StatusProvisioning
	Ready        Status = protocol.StatusReady
	Stopped      Status = protocol.StatusStopped
	Failed       Status = protocol.StatusFailed
	Deleting     Status = protocol.StatusDeleting
	Gone         Status = "gone"
)

// transitions lists, per state, the states it may move to.
var transitions = map[Status][]Status{
	Provisioning: {Ready, Failed, Deleting},
	Ready:        {Stopped, Deleting},
	Stopped:      {Ready, Stopped, Deleting},
	Failed:       {Provisioning, Deleting},
	Deleting:     {Deleting, Gone},
}

// statusOf is sb's lifecycle state.
func statusOf(sb *store.Sandbox) Status { return Status(sb.Status) }

// outcomeTimeout bounds one outcome write (a transition, an activity
// flush). Outcome writes run detached from the request that caused them:
// what happened must be recorded even when its client or deadline is gone.
const outcomeTimeout = 10 * time.Second

// outcomeContext is ctx without its cancellation, bounded by outcomeTimeout.
func outcomeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), outcomeTimeout)
}

// transition moves sb to state to with status message msg and persists it
// (Gone deletes the record), on a context detached from ctx. It is the one
// place a sandbox's status changes; a move the table does not list is a
// bug and is refused.
func (m *Manager) transition(ctx context.Context, sb *store.Sandbox, to Status, msg string) error {
	from := statusOf(sb)
	if !slices.Contains(transitions[from], to) {
		return fmt.Errorf("sandbox %s: no transition from %s to %s", sb.ID, from, to)
	}
	ctx, cancel := outcomeContext(ctx)
	defer cancel()
	if to == Gone {
		if err := m.cfg.Store.DeleteSandbox(ctx, sb.ID); err != nil {
			return err
		}
		sb.Status = string(to)
		return nil
	}
	now := time.Now().UTC()
	prev := *sb
	sb.Status, sb.StatusMessage, sb.UpdatedAt = string(to), msg, now
	switch to {
	case Stopped:
		sb.StoppedAt = &now
	case Ready:
		sb.StoppedAt = nil
	}
	if err := m.cfg.Store.UpdateSandbox(ctx, sb); err != nil {
		*sb = prev
		return fmt.Errorf("record sandbox %s %s: %w", sb.Name, to, err)
	}
	return nil
}

// op is an operation that depends on a sandbox's state: the states it
// accepts and the error kind it answers in any other.
type op struct {
	verb    string
	accepts []Status
	kind    error
}

// ops is every state-dependent operation. requireStatus checks them.
var (
	opStop     = op{"stopped", []Status{Ready, Stopped}, errdefs.ErrConflict}
	opCapture  = op{"captured", []Status{Ready, Stopped}, errdefs.ErrNotReady}
	opReset    = op{"reset", []Status{Ready, Stopped}, errdefs.ErrNotReady}
	opWake     = op{"used", []Status{Ready, Stopped}, errdefs.ErrNotReady}
	opStart    = op{"started", []Status{Ready, Stopped, Provisioning, Failed}, errdefs.ErrConflict}
	opProxy    = op{"given a proxy_config (only while it is ready)", []Status{Ready}, ErrInvalidRequest}
	opDelete   = op{"deleted", []Status{Provisioning, Ready, Stopped, Failed, Deleting}, errdefs.ErrConflict}
	opIdleStop = op{"stopped for idleness", []Status{Ready}, errdefs.ErrConflict}
	opTTLStop  = op{"deleted after its stop TTL", []Status{Stopped}, errdefs.ErrConflict}
)

// requireStatus is the guard every state-dependent operation goes
// through: nil when sb's state accepts o, else an error of o's kind.
func requireStatus(sb *store.Sandbox, o op) error {
	if slices.Contains(o.accepts, statusOf(sb)) {
		return nil
	}
	return fmt.Errorf("sandbox %s is %s and cannot be %s: %w", sb.Name, sb.Status, o.verb, o.kind)
}

package e2b

import (
	"context"
	"net/http"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// onTimeoutLabel records on a sandbox what E2B's timeout does to it, so a
// resume can restore it after a pause suspended it: onKill (the default),
// onPause (autoPause, keeping memory) or onPauseFS (autoPause without).
// It is kept out of the metadata the SDKs see.
const (
	onTimeoutLabel = "e2b/on-timeout"
	onKill         = "kill"
	onPause        = "pause"
	onPauseFS      = "pause-fs"
)

// lifecycle is what a sandbox's stop does under the on-timeout action:
// whether it keeps memory, and how long after it the sandbox is deleted
// (0: never). A killed-on-timeout sandbox is deleted one TTL unit after
// its idle stop; a paused one is kept.
func (d *Door) lifecycle(action string) protocol.UpdateSandboxRequest {
	keep, del := true, int64(0)
	switch action {
	case onPauseFS:
		keep = false
	case onPause:
	default:
		keep, del = false, int64(d.cfg.TTLGranularity/time.Second)
	}
	return protocol.UpdateSandboxRequest{PreserveMemoryOnStop: &keep, DeleteAfterStopSeconds: &del}
}

// timeoutRequest is the body of POST /sandboxes/{id}/timeout.
type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

func (d *Door) setTimeout(ctx context.Context, c *call) (any, error) {
	var in timeoutRequest
	if err := c.decode(&in); err != nil {
		return nil, err
	}
	if in.Timeout == nil {
		return nil, badRequest("timeout: is required")
	}
	return nil, d.applyTimeout(ctx, c.c, c.id, *in.Timeout)
}

func (d *Door) applyTimeout(ctx context.Context, c *cubicle.Client, name string, timeout int64) error {
	ttl, err := d.ttlSeconds(timeout)
	if err != nil {
		return err
	}
	_, err = c.UpdateSandbox(ctx, name, protocol.UpdateSandboxRequest{IdleTTLSeconds: &ttl})
	return err
}

// pauseRequest is the body of POST /sandboxes/{id}/pause.
type pauseRequest struct {
	Memory *bool `json:"memory"`
}

// pauseSandbox stops the sandbox keeping its memory (unless memory is
// false) and, whatever its timeout would do, keeps it until it is
// resumed or killed; a sandbox already stopped is a 409, which the SDKs
// read as "already paused".
func (d *Door) pauseSandbox(ctx context.Context, c *call) (any, error) {
	var in pauseRequest
	if err := c.decode(&in); err != nil {
		return nil, err
	}
	sb, err := c.c.GetSandbox(ctx, c.id)
	if err != nil {
		return nil, err
	}
	if sb.Status == protocol.StatusStopped {
		return nil, &apiError{Code: http.StatusConflict, Message: "sandbox " + c.id + " is already paused"}
	}
	keep, never := in.Memory == nil || *in.Memory, int64(0)
	if _, err := c.c.UpdateSandbox(ctx, c.id, protocol.UpdateSandboxRequest{PreserveMemoryOnStop: &keep, DeleteAfterStopSeconds: &never}); err != nil {
		return nil, err
	}
	return nil, c.c.StopSandbox(ctx, c.id)
}

// resumeRequest is the body of resume and connect.
type resumeRequest struct {
	Timeout *int64 `json:"timeout"`
	// Memory false boots cold instead of restoring memory (connect's
	// onResume "reboot").
	Memory *bool `json:"memory"`
}

// resumeSandbox starts a paused sandbox, restoring its memory when it has
// an image, and waits until it is running; a running one is a 409.
func (d *Door) resumeSandbox(ctx context.Context, c *call) (any, error) {
	sb, _, err := d.resume(ctx, c, false)
	if err != nil {
		return nil, err
	}
	return created(sb, c.key), nil
}

// connectSandbox serves connect: a running sandbox answers 200, a paused
// one is resumed first (201).
func (d *Door) connectSandbox(ctx context.Context, c *call) (any, error) {
	sb, resumed, err := d.resume(ctx, c, true)
	if err != nil {
		return nil, err
	}
	if resumed {
		return answer{status: http.StatusCreated, body: created(sb, c.key)}, nil
	}
	return created(sb, c.key), nil
}

// resume starts c.id if it is stopped (waiting until it is ready) and
// applies the request's timeout. A running sandbox is an error unless
// running is allowed (connect).
func (d *Door) resume(ctx context.Context, c *call, running bool) (*protocol.Sandbox, bool, error) {
	var in resumeRequest
	if err := c.decode(&in); err != nil {
		return nil, false, err
	}
	sb, err := c.c.GetSandbox(ctx, c.id)
	if err != nil {
		return nil, false, err
	}
	resumed := false
	switch sb.Status {
	case protocol.StatusStopped:
		if err := c.c.StartSandboxWith(ctx, c.id, protocol.StartSandboxRequest{RestoreMemory: restoreMemory(in.Memory)}); err != nil {
			return nil, false, err
		}
		if sb, err = c.c.WaitSandbox(ctx, c.id); err != nil {
			return nil, false, err
		}
		resumed = true
	case protocol.StatusReady, protocol.StatusProvisioning:
		if !running {
			return nil, false, &apiError{Code: http.StatusConflict, Message: "sandbox " + c.id + " is already running"}
		}
	default:
		return nil, false, &apiError{Code: http.StatusNotFound, Message: "sandbox " + c.id + " is " + sb.Status}
	}
	var up protocol.UpdateSandboxRequest
	if resumed {
		// The pause suspended the timeout's action; restore it.
		up = d.lifecycle(sb.Labels[onTimeoutLabel])
	}
	if in.Timeout != nil {
		ttl, err := d.ttlSeconds(*in.Timeout)
		if err != nil {
			return nil, false, err
		}
		up.IdleTTLSeconds = &ttl
	}
	if !up.Empty() {
		if _, err := c.c.UpdateSandbox(ctx, c.id, up); err != nil {
			return nil, false, err
		}
	}
	return sb, resumed, nil
}

// restoreMemory is Cubicle's restore_memory for an E2B memory flag: unset
// restores an image when there is one, false boots cold.
func restoreMemory(memory *bool) *bool {
	if memory != nil && !*memory {
		return memory
	}
	return nil
}

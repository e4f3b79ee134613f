package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Memory snapshots (include_memory / checkpoint on a capture or fork).
//
// A memory snapshot is a captured snapshot whose sandbox's memory image
// (runtime.Checkpointer) was saved at the same instant as its layer: the
// sandbox is paused by the checkpoint, its upper is snapshotted, and it is
// resumed. The image lives in Storage.MemoryDir(snapshot id)/image, deleted
// with the snapshot; the file tokenFile there, written last, marks the
// image complete and holds the source sandbox's agent token.
//
// A sandbox created from a memory snapshot is restored, not booted, on its
// first start: it gets its own upper over the captured layers, its own
// netns and address, and resumes the source's processes, PID 1 (the agent)
// included. Restarting it later boots it cold from its files, like any
// sandbox; so does a reset to a memory snapshot.
//
// The agent token. The restored agent wakes up holding the token its
// source had at the capture (kept in tokenFile, next to the image, on the
// host); the daemon replaces it through the agent's authenticated
// POST /v1/token with the branch's own fresh token before the branch is
// handed out (waitAgent), so the source's token does not open a branch, nor
// a branch's its source or siblings, and a process inside that reads the
// old token out of the agent's memory holds a token nothing accepts. What a
// memory snapshot does copy wholesale is every other secret of its source
// (keys, tokens, RNG state, TLS sessions); the daemon's API credentials
// never enter a sandbox. Each restored branch gets its own /etc/machine-id
// file, but shares the source's hostname and in-memory state, including
// userspace RNG state and any machine-id a process read before the capture
// (so random numbers may repeat); reset or restart a branch to give it its
// own.

const (
	memoryImageDir = "image"
	tokenFile      = "agent-token"
	// runtimeFile names the runtime that wrote a memory snapshot's image:
	// only that one can restore it, and a create from the snapshot that
	// names no runtime runs on it (imageRuntime). Images from before it
	// was written have none (gvisor was the only runtime that made them).
	runtimeFile = "runtime"
)

// imageRuntime is the runtime recorded in memory dir dir, "" if none.
func imageRuntime(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, runtimeFile))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// imageRuntimeFor is, for a create req from sn that names no runtime and
// would restore sn's memory image (restore_memory not false), the runtime
// that wrote that image when this daemon serves it: the branch resumes
// there rather than booting cold on the default.
func (m *Manager) imageRuntimeFor(req protocol.CreateSandboxRequest, sn *store.Snapshot) (runtime.Driver, bool) {
	if req.Runtime != "" || req.RestoreMemory != nil && !*req.RestoreMemory || sn.SourceSandboxID == "" {
		return nil, false
	}
	name := imageRuntime(m.cfg.Storage.MemoryDir(sn.ID))
	if name == "" {
		return nil, false
	}
	return m.rt.get(name)
}

// memoryImage returns the memory dir of snapshot sn (its image and
// tokenFile) and true when sn has a complete image that runtime d can
// restore.
func (m *Manager) memoryImage(d runtime.Driver, sn *store.Snapshot) (string, bool) {
	if sn.SourceSandboxID == "" {
		return "", false
	}
	dir := m.cfg.Storage.MemoryDir(sn.ID)
	return dir, completeMemory(d, dir)
}

// waitAgent waits until the new instance's agent answers at addr and
// returns a client for it holding token. An agent restored from the
// memory image in mem ("" for a cold boot) still holds the token recorded
// in mem's tokenFile (its source's at the capture, or its own at a
// memory-preserving stop): it is replaced by token before the sandbox is
// handed out, so each instance answers to its own token only.
func (m *Manager) waitAgent(ctx context.Context, d runtime.Driver, rid string, ip netip.Addr, token, mem string) (*agent.Client, error) {
	boot := token
	if mem != "" {
		b, err := os.ReadFile(filepath.Join(mem, tokenFile))
		if err != nil {
			return nil, fmt.Errorf("read memory image's agent token: %w", err)
		}
		boot = strings.TrimSpace(string(b))
	}
	client := m.agentClient(d, rid, ip, boot)
	if err := client.WaitReady(ctx, 2*time.Millisecond); err != nil {
		client.Close()
		return nil, fmt.Errorf("wait for agent: %w", err)
	}
	if mem != "" {
		if err := client.RotateToken(ctx, token); err != nil {
			client.Close()
			return nil, fmt.Errorf("give the restored agent its own token: %w", err)
		}
	}
	return client, nil
}

// checkpointAndCapture is freezeAndCapture with memory: sb (ready) is
// checkpointed, which leaves it paused, its upper is snapshotted while it
// is still paused, and it is resumed whatever happened. The memory image
// is removed again on failure.
func (m *Manager) checkpointAndCapture(ctx context.Context, sb *store.Sandbox, snap string) (string, time.Duration, error) {
	if statusOf(sb) != Ready {
		return "", 0, fmt.Errorf("sandbox %s is %s: no memory to capture", sb.Name, sb.Status)
	}
	d, err := m.driverOf(sb)
	if err != nil {
		return "", 0, err
	}
	ckpt := d.(runtime.Checkpointer)
	pauser, ok := d.(runtime.Pauser)
	if !ok {
		return "", 0, fmt.Errorf("the %s runtime can checkpoint but not resume a sandbox", d.Name())
	}
	rid := runtimeID(sb.ID)
	dir := m.cfg.Storage.MemoryDir(snap)
	image := filepath.Join(dir, memoryImageDir)
	if err := os.MkdirAll(image, 0o700); err != nil {
		return "", 0, fmt.Errorf("memory image dir: %w", err)
	}
	fail := func(err error) (string, time.Duration, error) {
		os.RemoveAll(dir)
		return "", 0, err
	}
	if err := m.cfg.Storage.Flush(ctx, rid); err != nil {
		return fail(err)
	}
	t0 := time.Now()
	cerr := ckpt.Checkpoint(ctx, rid, image)
	var layer string
	if cerr == nil {
		m.cfg.Faults.Hit(fault.CaptureCheckpointed)
		layer, cerr = m.cfg.Storage.Capture(ctx, rid, snap)
	}
	rerr := pauser.Resume(context.WithoutCancel(ctx), rid)
	paused := time.Since(t0)
	if rerr != nil {
		m.log.Error("resume sandbox after checkpoint", "sandbox", sb.ID, "err", rerr)
	}
	if err := errors.Join(cerr, rerr); err != nil {
		if layer != "" {
			m.cfg.Storage.RemoveCapture(context.WithoutCancel(ctx), snap)
		}
		return fail(fmt.Errorf("checkpoint sandbox %s: %w", sb.Name, err))
	}
	err = os.WriteFile(filepath.Join(dir, runtimeFile), []byte(d.Name()), 0o600)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, tokenFile), []byte(sb.Token), 0o600)
	}
	if err != nil {
		m.cfg.Storage.RemoveCapture(context.WithoutCancel(ctx), snap)
		return fail(fmt.Errorf("record memory snapshot: %w", err))
	}
	return layer, paused, nil
}

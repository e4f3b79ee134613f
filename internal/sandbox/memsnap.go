package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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
// The agent token. The restored agent still holds the token it was started
// with, and its memory cannot be edited from outside; so a sandbox created
// from a memory snapshot is given the source's token, and the source and
// all its restored branches share one token. What that allows: the token
// only lets the daemon in, over the sandbox's address, and sandboxes cannot
// reach each other or the host (the nftables table drops it), so a sandbox
// that reads the token out of its own memory gains nothing it did not have
// — it already holds every other secret of its source, which a memory
// snapshot copies wholesale (keys, tokens, RNG state, TLS sessions). Only
// something that can already connect from the host's network namespace
// could use a leaked token, against every member of the family instead of
// one. Not shared: the daemon's API credentials, which never enter a
// sandbox. Each restored branch gets its own /etc/machine-id file, but
// shares the source's hostname and in-memory state, including userspace
// RNG state and any machine-id a process read before the capture (so random
// numbers may repeat); reset or restart a branch to give it its own.

const (
	memoryImageDir = "image"
	tokenFile      = "agent-token"
)

// memoryImage returns the memory image directory of snapshot sn and true
// when sn has a complete one that this daemon's runtime can restore.
func (m *Manager) memoryImage(sn *store.Snapshot) (string, bool) {
	if sn.SourceSandboxID == "" {
		return "", false
	}
	if _, ok := m.cfg.Driver.(runtime.Checkpointer); !ok {
		return "", false
	}
	dir := m.cfg.Storage.MemoryDir(sn.ID)
	if _, err := os.Stat(filepath.Join(dir, tokenFile)); err != nil {
		return "", false
	}
	return filepath.Join(dir, memoryImageDir), true
}

// agentToken is the agent token of a new sandbox created from sn: the
// source's for a memory snapshot (see the package notes above), else a
// fresh random one.
func (m *Manager) agentToken(sn *store.Snapshot) string {
	if sn.SourceSandboxID != "" {
		b, err := os.ReadFile(filepath.Join(m.cfg.Storage.MemoryDir(sn.ID), tokenFile))
		if err == nil && len(strings.TrimSpace(string(b))) > 0 {
			return strings.TrimSpace(string(b))
		}
	}
	return randomHex(32)
}

// checkpointAndCapture is freezeAndCapture with memory: sb (ready) is
// checkpointed, which leaves it paused, its upper is snapshotted while it
// is still paused, and it is resumed whatever happened. The memory image
// is removed again on failure.
func (m *Manager) checkpointAndCapture(ctx context.Context, sb *store.Sandbox, snap string) (string, time.Duration, error) {
	if sb.Status != protocol.StatusReady {
		return "", 0, fmt.Errorf("sandbox %s is %s: no memory to capture", sb.Name, sb.Status)
	}
	ckpt := m.cfg.Driver.(runtime.Checkpointer)
	pauser, ok := m.cfg.Driver.(runtime.Pauser)
	if !ok {
		return "", 0, fmt.Errorf("the %s runtime can checkpoint but not resume a sandbox", m.cfg.Driver.Name())
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
	if err := os.WriteFile(filepath.Join(dir, tokenFile), []byte(sb.Token), 0o600); err != nil {
		m.cfg.Storage.RemoveCapture(context.WithoutCancel(ctx), snap)
		return fail(fmt.Errorf("record memory snapshot: %w", err))
	}
	return layer, paused, nil
}

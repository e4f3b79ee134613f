package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// createPreserving creates a ready sandbox with preserve_memory_on_stop.
func (e *env) createPreserving(t *testing.T, name string, req protocol.CreateSandboxRequest) *store.Sandbox {
	t.Helper()
	req.Name, req.PreserveMemoryOnStop = name, ptr(true)
	sb, err := e.m.CreateSandbox(as(member), req)
	if err != nil || sb.Status != protocol.StatusReady || !sb.PreserveMemoryOnStop {
		t.Fatalf("create %s: %+v, %v", name, sb, err)
	}
	return sb
}

// hasStopImage reports whether sandbox id has a complete stop image.
func (e *env) hasStopImage(id string) bool { return completeMemory(e.driver, e.m.stopMemoryDir(id)) }

// requireRestored checks sandbox id runs restored (or not) and that its
// agent answers to the record's token, not the checkpointed one.
func (e *env) requireRestored(t *testing.T, id string, want bool) {
	t.Helper()
	rid := runtimeID(id)
	if got := e.driver.Restored(rid); got != want {
		t.Fatalf("sandbox restored = %v, want %v", got, want)
	}
	if a := e.driver.Agent(rid); a == nil || a.Token() != e.get(t, id).Token {
		t.Fatal("the running agent does not hold the sandbox's current token")
	}
}

func TestMemoryPreservingStopAndStart(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb := e.createPreserving(t, "keep", protocol.CreateSandboxRequest{})
	oldToken := e.get(t, sb.ID).Token

	stopped, err := e.m.StopSandbox(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	if stopped.Status != protocol.StatusStopped || !strings.Contains(stopped.StatusMessage, "memory preserved") {
		t.Fatalf("after stop: %s (%s)", stopped.Status, stopped.StatusMessage)
	}
	if !e.hasStopImage(sb.ID) || e.driver.Instances() != 0 {
		t.Fatalf("stop left image=%v, %d instances", e.hasStopImage(sb.ID), e.driver.Instances())
	}

	started, err := e.m.StartSandbox(ctx, "keep")
	if err != nil {
		t.Fatal(err)
	}
	if started.Status != protocol.StatusReady || started.StatusMessage != "" {
		t.Fatalf("after start: %s (%s)", started.Status, started.StatusMessage)
	}
	e.requireRestored(t, sb.ID, true)
	if started.Token == oldToken {
		t.Fatal("the restored instance kept the checkpointed token")
	}
	if e.hasStopImage(sb.ID) {
		t.Fatal("the image outlived the restore it served")
	}

	// The next stop and start go round again; a plain restart does not.
	if _, err := e.m.StopSandbox(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, true)
	if _, err := e.m.UpdateSandbox(ctx, "keep", protocol.UpdateSandboxRequest{PreserveMemoryOnStop: ptr(false)}); err != nil {
		t.Fatal(err)
	}
	if e.get(t, sb.ID).PreserveMemoryOnStop {
		t.Fatal("PATCH did not clear preserve_memory_on_stop")
	}
	if _, err := e.m.StopSandbox(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	if e.hasStopImage(sb.ID) {
		t.Fatal("a stop without preserve_memory_on_stop checkpointed")
	}
	if _, err := e.m.StartSandbox(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, false)
}

// TestIdleStopPreservesMemoryAndWakeRestores: the reaper's stop
// checkpoints, and a dataplane request's wake-up restores.
func TestIdleStopPreservesMemoryAndWakeRestores(t *testing.T) {
	e := newEnv(t)
	sb := e.createPreserving(t, "idle", protocol.CreateSandboxRequest{IdleTTLSeconds: ptr(int64(2))})
	e.backdate(sb.ID, time.Minute)
	e.m.Reap(context.Background())
	got := e.get(t, sb.ID)
	if got.Status != protocol.StatusStopped || !strings.Contains(got.StatusMessage, "idle_ttl_seconds") ||
		!strings.Contains(got.StatusMessage, "memory preserved") || !e.hasStopImage(sb.ID) {
		t.Fatalf("after idle stop: %s (%s), image %v", got.Status, got.StatusMessage, e.hasStopImage(sb.ID))
	}
	c, err := e.m.Dataplane(as(member), sb.ID, authz.Exec)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	e.requireRestored(t, sb.ID, true)
}

func TestRestoreMemoryChoices(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb := e.createPreserving(t, "choice", protocol.CreateSandboxRequest{})
	if _, err := e.m.StopSandbox(ctx, "choice"); err != nil {
		t.Fatal(err)
	}
	// false: a cold boot, and the image is gone.
	if _, err := e.m.StartSandbox(WithRestoreMemory(ctx, ptr(false)), "choice"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, false)
	if e.hasStopImage(sb.ID) {
		t.Fatal("restore_memory: false kept the image")
	}
	// true without an image: a conflict, and the sandbox stays stopped.
	if _, err := e.m.StopSandbox(ctx, "choice"); err != nil {
		t.Fatal(err)
	}
	e.m.discardMemory(sb.ID)
	_, err := e.m.StartSandbox(WithRestoreMemory(ctx, ptr(true)), "choice")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "no memory image") {
		t.Fatalf("restore_memory: true without an image: %v", err)
	}
	if got := e.get(t, sb.ID); got.Status != protocol.StatusStopped || e.driver.Instances() != 0 {
		t.Fatalf("after the refused start: %s, %d instances", got.Status, e.driver.Instances())
	}
	// true with an image restores.
	if _, err := e.m.StartSandbox(ctx, "choice"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StopSandbox(ctx, "choice"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(WithRestoreMemory(ctx, ptr(true)), "choice"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, true)

	// On create, restore_memory picks what happens to a memory
	// snapshot's image: restored when unset or true, not when false.
	v, err := e.m.CaptureSnapshot(ctx, "choice", protocol.CaptureSnapshotRequest{Name: "mem", IncludeMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]*bool{"m-unset": nil, "m-true": ptr(true), "m-false": ptr(false)} {
		b, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: name, SnapshotID: v.Snapshot.ID, RestoreMemory: want})
		if err != nil || b.Status != protocol.StatusReady {
			t.Fatalf("create %s: %+v, %v", name, b, err)
		}
		e.requireRestored(t, b.ID, want == nil || *want)
	}
	// restore_memory: true needs a memory snapshot.
	_, err = e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "must", RestoreMemory: ptr(true)})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("create with restore_memory: true from a plain snapshot: %v", err)
	}
	if _, err := e.st.GetSandbox(context.Background(), workspace, "must"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the refused create left a record: %v", err)
	}
}

func TestFailedCheckpointAndRestoreFallBack(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb := e.createPreserving(t, "flaky", protocol.CreateSandboxRequest{})

	e.driver.CheckpointErr = errors.New("disk full")
	stopped, err := e.m.StopSandbox(ctx, "flaky")
	if err != nil {
		t.Fatal(err)
	}
	if stopped.Status != protocol.StatusStopped || !strings.Contains(stopped.StatusMessage, "memory not preserved") ||
		!strings.Contains(stopped.StatusMessage, "disk full") || e.driver.Instances() != 0 {
		t.Fatalf("failed checkpoint: %s (%s), %d instances", stopped.Status, stopped.StatusMessage, e.driver.Instances())
	}
	if _, err := os.Stat(e.m.stopMemoryDir(sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed checkpoint left its dir: %v", err)
	}
	if _, err := e.m.StartSandbox(ctx, "flaky"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, false)
	e.driver.CheckpointErr = nil

	// A failed restore fails a start that requires it, keeping the image
	// for a retry, and boots cold (saying so) when restore_memory is unset.
	if _, err := e.m.StopSandbox(ctx, "flaky"); err != nil {
		t.Fatal(err)
	}
	e.driver.RestoreErr = errors.New("image corrupt")
	_, err = e.m.StartSandbox(WithRestoreMemory(ctx, ptr(true)), "flaky")
	if err == nil || !strings.Contains(err.Error(), "image corrupt") {
		t.Fatalf("restore_memory: true with a failing restore: %v", err)
	}
	if got := e.get(t, sb.ID); got.Status != protocol.StatusStopped || !e.hasStopImage(sb.ID) {
		t.Fatalf("after the failed required restore: %s, image %v", got.Status, e.hasStopImage(sb.ID))
	}
	started, err := e.m.StartSandbox(ctx, "flaky")
	if err != nil {
		t.Fatal(err)
	}
	if started.Status != protocol.StatusReady || !strings.Contains(started.StatusMessage, "memory not restored") {
		t.Fatalf("fallback boot: %s (%s)", started.Status, started.StatusMessage)
	}
	e.requireRestored(t, sb.ID, false)
	if e.hasStopImage(sb.ID) {
		t.Fatal("the image outlived the fallback boot")
	}
}

// TestStopImageLifetime: a stop image survives a daemon restart and goes
// with a reset and a delete.
func TestStopImageLifetime(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	a := e.createPreserving(t, "a", protocol.CreateSandboxRequest{})
	b := e.createPreserving(t, "b", protocol.CreateSandboxRequest{})
	for _, n := range []string{"a", "b"} {
		if _, err := e.m.StopSandbox(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	e.reopen(t) // the daemon restarts while both are stopped
	if !e.hasStopImage(a.ID) || !e.hasStopImage(b.ID) {
		t.Fatal("a daemon restart lost a stop image")
	}
	if _, err := e.m.StartSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, a.ID, true)

	if _, err := e.m.StopSandbox(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.ResetSandbox(ctx, "a", ""); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, a.ID, false)
	if e.hasStopImage(a.ID) {
		t.Fatal("reset kept the stop image")
	}
	if err := e.m.DeleteSandbox(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.m.stopMemoryDir(b.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("delete kept the stop image: %v", err)
	}
}

// TestInterruptedCheckpointIsNoImage: an image without its tokenFile (a
// daemon killed during the checkpoint) is not restored, and the boot
// removes it.
func TestInterruptedCheckpointIsNoImage(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	sb := e.createPreserving(t, "cut", protocol.CreateSandboxRequest{})
	if _, err := e.m.StopSandbox(ctx, "cut"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(e.m.stopMemoryDir(sb.ID), tokenFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.StartSandbox(WithRestoreMemory(ctx, ptr(true)), "cut"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("restore_memory: true over an incomplete image: %v", err)
	}
	if _, err := e.m.StartSandbox(ctx, "cut"); err != nil {
		t.Fatal(err)
	}
	e.requireRestored(t, sb.ID, false)
	if _, err := os.Stat(e.m.stopMemoryDir(sb.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the incomplete image outlived the boot: %v", err)
	}
}

// plainDriver hides the fake driver's Checkpointer, as the namespace
// runtime has none.
type plainDriver struct{ runtime.Driver }

func TestPreserveMemoryNeedsACheckpointer(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Drivers = []runtime.Driver{plainDriver{c.Drivers[0]}} })
	ctx := as(member)
	var fe *errdefs.FieldError
	_, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "x", PreserveMemoryOnStop: ptr(true)})
	if !errors.As(err, &fe) || fe.Field != "preserve_memory_on_stop" {
		t.Fatalf("create: %v", err)
	}
	e.create(t, member, "y")
	_, err = e.m.UpdateSandbox(ctx, "y", protocol.UpdateSandboxRequest{PreserveMemoryOnStop: ptr(true)})
	if !errors.As(err, &fe) || fe.Field != "preserve_memory_on_stop" {
		t.Fatalf("patch: %v", err)
	}
	if _, err := e.m.UpdateSandbox(ctx, "y", protocol.UpdateSandboxRequest{PreserveMemoryOnStop: ptr(false)}); err != nil {
		t.Fatalf("patch to false: %v", err)
	}
}

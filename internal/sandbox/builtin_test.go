package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// fakeSource is a BuiltinSource whose Make reports one step and then
// waits for release (closed) before answering err or an image of layers.
type fakeSource struct {
	key     string
	layers  []string
	release chan struct{}
	err     error
	calls   atomic.Int32
}

func newFakeSource(key string, layers []string) *fakeSource {
	return &fakeSource{key: key, layers: layers, release: make(chan struct{})}
}

func (f *fakeSource) Key() string      { return f.key }
func (f *fakeSource) Describe() string { return "fake " + f.key }

func (f *fakeSource) Make(ctx context.Context, ws string, progress func(string, int)) (*image.Image, map[string]string, error) {
	f.calls.Add(1)
	if ws != store.BuiltinWorkspace {
		return nil, nil, fmt.Errorf("made in workspace %q", ws)
	}
	progress("installing packages", 42)
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	if f.err != nil {
		return nil, nil, f.err
	}
	return &image.Image{Digest: "sha256:" + f.key, Layers: f.layers, Config: protocol.RunConfig{User: "user", WorkDir: "/home/user"}},
		map[string]string{"python3": "3.11.2-1+b1"}, nil
}

// builtinEnv is an env whose workspace has no "default" of its own.
func builtinEnv(t *testing.T) *env {
	e := newEnv(t)
	if err := e.st.DeleteSnapshot(context.Background(), workspace, e.snap.ID); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *env) builtins(t *testing.T) []*store.Snapshot {
	t.Helper()
	all, err := e.st.ListSnapshots(context.Background(), store.BuiltinWorkspace, store.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// awaitStatus waits for built-in id to reach status.
func (e *env) awaitStatus(t *testing.T, id, status string) *store.Snapshot {
	t.Helper()
	var sn *store.Snapshot
	eventually(t, "snapshot "+id+" "+status, func() bool {
		var err error
		sn, err = e.st.GetSnapshot(context.Background(), workspace, id)
		return err == nil && sn.Status == status
	})
	return sn
}

// TestBuiltinBuilding: while the built-in default builds, every member
// lists it building with its progress, a create that does not wait is
// answered pending (the API's 503 NotReady with Retry-After), one that
// waits gets a sandbox once the build ends; no one may delete it.
func TestBuiltinBuilding(t *testing.T) {
	e := builtinEnv(t)
	src := newFakeSource("k1", e.snap.Layers)
	if err := e.m.EnsureBuiltin(context.Background(), "default", src); err != nil {
		t.Fatal(err)
	}
	var listed *SnapshotView
	eventually(t, "progress in the list", func() bool {
		l, err := e.m.ListSnapshots(as(member), store.ListOptions{})
		if err != nil || len(l) != 1 {
			return false
		}
		listed = l[0]
		return listed.BuildStep != ""
	})
	if listed.Name != "default" || listed.Status != protocol.SnapshotBuilding || listed.BuildPercent != 42 || listed.BuildStep != "installing packages" {
		t.Fatalf("listed %s %s at %d%% %q; want default building at 42%% installing packages", listed.Name, listed.Status, listed.BuildPercent, listed.BuildStep)
	}

	_, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{WaitForReady: ptr(false)})
	var pe *errdefs.PendingError
	if !errors.As(err, &pe) || pe.RetryAfter <= 0 || !errors.Is(err, errdefs.ErrNotReady) || !strings.Contains(err.Error(), "42%") {
		t.Fatalf("create while building: %v; want a pending error with a retry hint and the progress", err)
	}
	// The official clients' default: wait_for_ready with a timeout.
	got := make(chan error, 1)
	var sb *store.Sandbox
	go func() {
		var err error
		sb, err = e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{WaitForReady: ptr(true), Timeout: ptr[int64](10)})
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	close(src.release)
	if err := <-got; err != nil {
		t.Fatalf("create waiting for the build: %v", err)
	}
	if sb.SnapshotID != listed.ID || sb.Status != protocol.StatusReady {
		t.Fatalf("sandbox from %s (%s); want the built-in %s ready", sb.SnapshotID, sb.Status, listed.ID)
	}
	v, err := e.m.GetSnapshot(as(member), "default")
	if err != nil {
		t.Fatalf("get default: %v", err)
	}
	if v.Packages["python3"] != "3.11.2-1+b1" || v.WorkspaceID != store.BuiltinWorkspace || v.RunConfig.User != "user" {
		t.Fatalf("get default: %+v, %v; want the built-in with its packages", v, err)
	}
	if err := e.m.DeleteSnapshot(as(admin), v.ID); !errors.Is(err, errdefs.ErrForbidden) {
		t.Fatalf("admin deleting the built-in: %v, want forbidden", err)
	}
	// A second start with the same source builds nothing.
	if err := e.m.EnsureBuiltin(context.Background(), "default", src); err != nil {
		t.Fatal(err)
	}
	if n := src.calls.Load(); n != 1 || len(e.builtins(t)) != 1 {
		t.Fatalf("after a second ensure: %d builds, %d records; want 1 and 1", n, len(e.builtins(t)))
	}
}

// TestBuiltinRebuild: a new source key builds a second record; the old
// one stays while a sandbox runs from it, new creates boot the new one,
// and the old one goes once nothing uses it. A workspace's own "default"
// overrides the built-in.
func TestBuiltinRebuild(t *testing.T) {
	e := builtinEnv(t)
	ctx := context.Background()
	v1 := newFakeSource("k1", e.snap.Layers)
	close(v1.release)
	if err := e.m.EnsureBuiltin(ctx, "default", v1); err != nil {
		t.Fatal(err)
	}
	old := e.awaitStatus(t, e.builtins(t)[0].ID, protocol.SnapshotReady)
	first := e.create(t, member, "first")

	v2 := newFakeSource("k2", e.snap.Layers)
	if err := e.m.EnsureBuiltin(ctx, "default", v2); err != nil {
		t.Fatal(err)
	}
	// While v2 builds, creates still boot the ready v1.
	if sb := e.create(t, member, "during"); sb.SnapshotID != old.ID {
		t.Fatalf("during the rebuild a create booted %s, want the ready %s", sb.SnapshotID, old.ID)
	}
	close(v2.release)
	var fresh *store.Snapshot
	for _, sn := range e.builtins(t) {
		if sn.ID != old.ID {
			fresh = e.awaitStatus(t, sn.ID, protocol.SnapshotReady)
		}
	}
	if fresh == nil {
		t.Fatal("no second built-in record")
	}
	if sb := e.create(t, member, "after"); sb.SnapshotID != fresh.ID {
		t.Fatalf("after the rebuild a create booted %s, want %s", sb.SnapshotID, fresh.ID)
	}
	if _, err := e.st.GetSnapshot(ctx, workspace, old.ID); err != nil {
		t.Fatalf("the old built-in went while sandboxes use it: %v", err)
	}
	if got, _ := e.m.GetSandbox(as(member), first.Name); got == nil || got.Status != protocol.StatusReady {
		t.Fatalf("the sandbox on the old built-in: %+v", got)
	}
	for _, name := range []string{"first", "during"} {
		if err := e.m.DeleteSandbox(as(member), name); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.EnsureBuiltin(ctx, "default", v2); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.GetSnapshot(ctx, workspace, old.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("the unused old built-in: %v, want deleted", err)
	}

	own := &store.Snapshot{ID: "own-default", WorkspaceID: workspace, CreatedBy: member.User, Name: "default",
		Status: protocol.SnapshotReady, Layers: e.snap.Layers, CreatedAt: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
	if err := e.st.CreateSnapshot(ctx, own); err != nil {
		t.Fatal(err)
	}
	if sb := e.create(t, member, "own"); sb.SnapshotID != own.ID {
		t.Fatalf("with its own default a workspace booted %s, want %s", sb.SnapshotID, own.ID)
	}
}

// TestBuiltinFailedRetried: a failed build shows its error, a create
// names it, and the next ensure (the next start) builds the same record
// again; a build a restart interrupted is marked failed and rebuilt too.
func TestBuiltinFailedRetried(t *testing.T) {
	e := builtinEnv(t)
	ctx := context.Background()
	bad := newFakeSource("k1", e.snap.Layers)
	bad.err = errors.New("deb.debian.org unreachable")
	close(bad.release)
	if err := e.m.EnsureBuiltin(ctx, "default", bad); err != nil {
		t.Fatal(err)
	}
	id := e.builtins(t)[0].ID
	sn := e.awaitStatus(t, id, protocol.SnapshotFailed)
	if !strings.Contains(sn.StatusMessage, "deb.debian.org unreachable") {
		t.Fatalf("failed build's message %q", sn.StatusMessage)
	}
	_, err := e.m.CreateSandbox(as(member), protocol.CreateSandboxRequest{})
	var pe *errdefs.PendingError
	if errors.As(err, &pe) || !errors.Is(err, errdefs.ErrNotReady) || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("create from a failed built-in: %v; want not ready with the reason, not pending", err)
	}

	hung := newFakeSource("k1", e.snap.Layers) // never released: the restart interrupts it
	if err := e.m.EnsureBuiltin(ctx, "default", hung); err != nil {
		t.Fatal(err)
	}
	e.awaitStatus(t, id, protocol.SnapshotBuilding)
	e.reopen(t)
	if sn := e.awaitStatus(t, id, protocol.SnapshotFailed); !strings.Contains(sn.StatusMessage, "restart") {
		t.Fatalf("interrupted build's message %q", sn.StatusMessage)
	}

	good := newFakeSource("k1", e.snap.Layers)
	close(good.release)
	if err := e.m.EnsureBuiltin(ctx, "default", good); err != nil {
		t.Fatal(err)
	}
	e.awaitStatus(t, id, protocol.SnapshotReady)
	if n := len(e.builtins(t)); n != 1 {
		t.Fatalf("%d built-in records after retries, want the one rebuilt in place", n)
	}
}

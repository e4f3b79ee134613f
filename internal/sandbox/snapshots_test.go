package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/go-containerregistry/pkg/authn"
)

// images fakes ImageSource: "busybox" resolves to one layer, anything else
// fails; block, when set, holds a pull until ctx ends.
type images struct {
	layer string
	block bool
}

func (i *images) Resolve(ctx context.Context, _, ref string, _ authn.Authenticator, progress func(image.Progress)) (*image.Image, error) {
	if i.block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if ref != "busybox" {
		return nil, errors.New("manifest unknown")
	}
	if progress != nil {
		progress(image.Progress{Total: 10, Complete: 10})
	}
	return &image.Image{Digest: "sha256:abc", Layers: []string{i.layer}, Config: protocol.RunConfig{WorkDir: "/"}}, nil
}

// LoadReader implements ImageSource: an archive holding "busybox" loads
// as the image Resolve gives; anything else is not an image archive.
func (i *images) LoadReader(ctx context.Context, ws string, r io.Reader, _ string) ([]*image.Image, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if !bytes.Contains(b, []byte("busybox")) {
		return nil, fmt.Errorf("not an image archive: %w", errdefs.ErrInvalid)
	}
	img, err := i.Resolve(ctx, ws, "busybox", nil, nil)
	return []*image.Image{img}, err
}

func withImages(i *images) envOption { return func(c *Config) { c.Images = i } }

func TestSnapshotBuildAndDelete(t *testing.T) {
	imgs := &images{layer: t.TempDir()}
	e := newEnv(t, withImages(imgs))
	ctx := as(member)
	v, err := e.m.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "bb", DockerImage: "busybox", FSCapacityBytes: 1 << 30, RunConfig: &protocol.RunConfig{User: "u"}})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := e.m.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "nope", DockerImage: "nope", FSCapacityBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the builds", func() bool {
		a, _ := e.m.GetSnapshot(ctx, v.ID)
		b, _ := e.m.GetSnapshot(ctx, bad.ID)
		return a.Status != protocol.SnapshotBuilding && b.Status != protocol.SnapshotBuilding
	})
	got, _ := e.m.GetSnapshot(ctx, v.ID)
	if got.Status != protocol.SnapshotReady || got.ImageDigest != "sha256:abc" || got.RunConfig.User != "u" || got.RunConfig.WorkDir != "/" {
		t.Fatalf("built snapshot: %+v", got.Snapshot)
	}
	if b, _ := e.m.GetSnapshot(ctx, bad.ID); b.Status != protocol.SnapshotFailed || b.StatusMessage == "" {
		t.Fatalf("failed build: %+v", b.Snapshot)
	}
	if list, err := e.m.ListSnapshots(ctx, store.ListOptions{}); err != nil || len(list) != 3 {
		t.Fatalf("list: %v %d", err, len(list))
	}
	if _, err := e.m.CreateSnapshot(ctx, protocol.CreateSnapshotRequest{Name: "r", DockerImage: "busybox", FSCapacityBytes: 1 << 30, RegistryID: "reg"}); fieldOf(err) != "registry_id" {
		t.Fatalf("registry_id without credentials: %v", err)
	}
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "on-bb", SnapshotID: "bb"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteSnapshot(ctx, v.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of a snapshot in use: %v", err)
	}
	if inUse, _ := e.m.LayersInUse(ctx); !slices.Contains(inUse, imgs.layer) {
		t.Fatal("the image layer a snapshot stacks is not in use")
	}
	if err := e.m.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteSnapshot(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
}

func TestBuildInterruptedByCloseStaysBuilding(t *testing.T) {
	e := newEnv(t, withImages(&images{block: true}))
	v, err := e.m.CreateSnapshot(as(member), protocol.CreateSnapshotRequest{Name: "slow", DockerImage: "busybox", FSCapacityBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteSnapshot(as(member), v.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of a building snapshot: %v", err)
	}
	e.m.Close()
	sn, err := e.st.GetSnapshot(context.Background(), workspace, v.ID)
	if err != nil || sn.Status != protocol.SnapshotBuilding {
		t.Fatalf("a build cut by shutdown must stay building for Recover: %v %+v", err, sn)
	}
	// The next daemon resumes it.
	e.m.cfg.Images = &images{layer: t.TempDir()}
	e.reopen(t)
	eventually(t, "the resumed build", func() bool {
		sn, _ := e.st.GetSnapshot(context.Background(), workspace, v.ID)
		return sn.Status == protocol.SnapshotReady
	})
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCaptureForkResetDiff(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	parent := e.create(t, member, "parent")
	writeFile(t, filepath.Join(e.storage.UpperDir(runtimeID(parent.ID)), "work/a.txt"), "hello")
	v, err := e.m.CaptureSnapshot(ctx, "parent", protocol.CaptureSnapshotRequest{Name: "cap"})
	if err != nil {
		t.Fatal(err)
	}
	if v.SourceSandboxID != parent.ID || len(v.Layers) != 2 || v.Layers[1] != e.storage.CaptureLayer(v.ID) {
		t.Fatalf("captured snapshot: %+v", v.Snapshot)
	}
	if e.driver.Paused(runtimeID(parent.ID)) {
		t.Fatal("the sandbox was left frozen after the capture")
	}
	if _, err := os.Stat(filepath.Join(v.Layers[1], "work/a.txt")); err != nil {
		t.Fatalf("the capture lacks the sandbox's file: %v", err)
	}
	if _, err := e.m.CaptureSnapshot(ctx, "parent", protocol.CaptureSnapshotRequest{Name: "bad name!"}); fieldOf(err) != "name" {
		t.Fatalf("capture with a bad name: %v", err)
	}

	res, err := e.m.Fork(ctx, "parent", protocol.ForkRequest{Count: 2, Names: []string{"b1", "b2"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != 2 || res.Snapshot.SourceSandboxID != parent.ID {
		t.Fatalf("fork: %+v", res)
	}
	mids := map[string]bool{}
	for _, b := range res.Sandboxes {
		if b.Status != protocol.StatusReady || b.IdleTTLSeconds != parent.IdleTTLSeconds || b.MemBytes != parent.MemBytes {
			t.Fatalf("branch %s: %+v", b.Name, b)
		}
		mid, err := os.ReadFile(filepath.Join(e.storage.UpperDir(runtimeID(b.ID)), "etc/machine-id"))
		if err != nil {
			t.Fatalf("branch %s has no machine-id of its own: %v", b.Name, err)
		}
		mids[string(mid)] = true
	}
	if len(mids) != 2 {
		t.Fatal("branches share a machine-id")
	}
	if _, err := e.m.Fork(ctx, "parent", protocol.ForkRequest{Count: 0}); fieldOf(err) != "count" {
		t.Fatalf("fork of 0: %v", err)
	}
	if _, err := e.m.Fork(ctx, "parent", protocol.ForkRequest{Count: 2, Names: []string{"x"}}); fieldOf(err) != "names" {
		t.Fatalf("fork with too few names: %v", err)
	}

	// The fork's snapshot cannot go while branches boot from it, and the
	// capture cannot go while the fork's snapshot stacks on its layer.
	if err := e.m.DeleteSnapshot(ctx, res.Snapshot.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of a snapshot branches use: %v", err)
	}

	// Diff: a branch against its snapshot, after a write.
	b1 := res.Sandboxes[0]
	writeFile(t, filepath.Join(e.storage.UpperDir(runtimeID(b1.ID)), "work/new.txt"), "x")
	changes, err := e.m.Diff(ctx, res.Snapshot.ID, "b1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(changes, func(c storage.Change) bool { return c.Path == "/work/new.txt" }) {
		t.Fatalf("diff misses the branch's write: %+v", changes)
	}
	if _, err := e.m.Diff(ctx, "no-such", "b1"); !errdefs.IsNotFound(err) {
		t.Fatalf("diff with an unknown side: %v", err)
	}

	// Reset drops the write and keeps the identity.
	got, err := e.m.ResetSandbox(ctx, "b1", "")
	if err != nil || got.Status != protocol.StatusReady || got.ID != b1.ID {
		t.Fatalf("reset: %v %+v", err, got)
	}
	if _, err := os.Stat(filepath.Join(e.storage.UpperDir(runtimeID(b1.ID)), "work/new.txt")); !os.IsNotExist(err) {
		t.Fatal("reset kept the branch's write")
	}
	// Reset onto another snapshot re-points the sandbox.
	if got, err = e.m.ResetSandbox(ctx, "b1", "default"); err != nil || got.SnapshotID != e.snap.ID {
		t.Fatalf("reset onto default: %v %+v", err, got)
	}

	usage, err := e.m.Usage(ctx, []*store.Sandbox{parent}, []*store.Snapshot{v.Snapshot, e.snap})
	if err != nil || usage[parent.ID] != 1 || usage[v.ID] != 1 || len(usage) != 2 {
		t.Fatalf("usage: %v %v", usage, err)
	}
	if e.m.StorageBackend() != "fake" || e.m.Runtimes()[0].Name != "fake" {
		t.Fatal("backend and runtime names")
	}

	// Deleting in dependency order frees everything.
	for _, b := range res.Sandboxes {
		if err := e.m.DeleteSandbox(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.DeleteSnapshot(ctx, res.Snapshot.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.m.DeleteSnapshot(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(e.storage.CaptureLayer(v.ID)); !os.IsNotExist(err) {
		t.Fatal("a deleted snapshot's captured layer is left")
	}
}

func TestMemoryForkRestoresWithOwnToken(t *testing.T) {
	e := newEnv(t)
	ctx := as(member)
	parent := e.create(t, member, "mem")
	res, err := e.m.Fork(ctx, "mem", protocol.ForkRequest{Count: 1, IncludeMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	b := res.Sandboxes[0]
	ag := e.driver.Agent(runtimeID(b.ID))
	if ag == nil {
		t.Fatal("the branch has no instance")
	}
	parentTok := e.get(t, parent.ID).Token
	if tok := ag.Token(); tok == parentTok || tok != e.get(t, b.ID).Token {
		t.Fatal("the restored branch does not answer to its own token only")
	}
	if e.driver.Paused(runtimeID(parent.ID)) {
		t.Fatal("the parent was left paused after the checkpoint")
	}
	// A stopped sandbox has no memory to capture.
	if _, err := e.m.StopSandbox(ctx, "mem"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.CaptureSnapshot(ctx, "mem", protocol.CaptureSnapshotRequest{Name: "m2", IncludeMemory: true}); fieldOf(err) != "include_memory" {
		t.Fatalf("memory capture of a stopped sandbox: %v", err)
	}
	// ...but its files can be captured as they are.
	if _, err := e.m.CaptureSnapshot(ctx, "mem", protocol.CaptureSnapshotRequest{Name: "files"}); err != nil {
		t.Fatalf("capture of a stopped sandbox: %v", err)
	}
}

// egress fakes the Egress enforcer, recording attachments.
type egress struct {
	mu       sync.Mutex
	attached map[string][]byte
}

func (g *egress) Validate(_ context.Context, _ auth.Principal, cfg []byte) error {
	if string(cfg) == `{"bad":true}` {
		return errdefs.Field("proxy_config", "bad")
	}
	return nil
}

func (g *egress) Attach(_ context.Context, id, _ string, _ *network.Endpoint, cfg []byte) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.attached[id] = cfg
	return nil
}

func (g *egress) Detach(_ context.Context, id string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.attached, id)
	return nil
}

func (g *egress) PrepareRootFS(context.Context, string) ([]string, error) {
	return []string{"HTTPS_PROXY=x"}, nil
}

func (g *egress) policy(id string) ([]byte, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := g.attached[id]
	return p, ok
}

func TestEgressFollowsLifecycleAndForks(t *testing.T) {
	g := &egress{attached: map[string][]byte{}}
	e := newEnv(t, func(c *Config) { c.Egress = g })
	ctx := as(member)
	if _, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "x", ProxyConfig: []byte(`{"bad":true}`)}); fieldOf(err) != "proxy_config" {
		t.Fatalf("create with a bad proxy_config: %v", err)
	}
	sb, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "p", ProxyConfig: []byte(` {"a":1} `)})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := g.policy(sb.ID); !ok || string(p) != `{"a":1}` {
		t.Fatalf("policy at boot: %q %v", p, ok)
	}
	if spec, _ := e.driver.Spec(runtimeID(sb.ID)); !slices.Contains(spec.Env, "HTTPS_PROXY=x") {
		t.Fatal("the proxy's environment is not in the sandbox's")
	}
	if _, err := e.m.UpdateSandbox(ctx, "p", protocol.UpdateSandboxRequest{ProxyConfig: []byte(`{"b":2}`)}); err != nil {
		t.Fatal(err)
	}
	if p, _ := g.policy(sb.ID); string(p) != `{"b":2}` || string(e.get(t, sb.ID).ProxyConfig) != `{"b":2}` {
		t.Fatal("PATCH proxy_config was not enforced and stored")
	}
	res, err := e.m.Fork(ctx, "p", protocol.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := g.policy(res.Sandboxes[0].ID); string(p) != `{"b":2}` {
		t.Fatalf("the branch did not inherit its parent's policy: %q", p)
	}
	if _, err := e.m.StopSandbox(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	if _, ok := g.policy(sb.ID); ok {
		t.Fatal("a stopped sandbox is still attached to the proxy")
	}
	e.m.Close()
	e.reopen(t) // the branch is re-adopted and re-attached
	if _, ok := g.policy(res.Sandboxes[0].ID); !ok {
		t.Fatal("a re-adopted sandbox was not re-attached to the proxy")
	}
}

package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/build"
	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/google/uuid"
)

// buildWorker is build.Worker over the manager's seams, for workspace ws.
// Every layer it makes is a storage capture named by a fresh id, which the
// step cache then owns.
type buildWorker struct {
	m  *Manager
	ws string
}

var _ build.Worker = (*buildWorker)(nil)

// Base resolves ref to a ready snapshot of the workspace the caller may
// boot (so blueprints stack), else to an image (local, then registry).
func (w *buildWorker) Base(ctx context.Context, ref string) (build.Base, error) {
	sn, err := w.m.snapshotByRef(ctx, w.ws, ref)
	if err == nil {
		p, err := principalOf(ctx)
		if err != nil {
			return build.Base{}, err
		}
		if err := w.m.checkSnapshot(ctx, p, sn, authz.BootSnapshot, ref); err != nil {
			return build.Base{}, err
		}
		if sn.Status != protocol.SnapshotReady {
			return build.Base{}, fmt.Errorf("snapshot %s is %s, not ready: %w", ref, sn.Status, errdefs.ErrNotReady)
		}
		h := sha256.Sum256([]byte(strings.Join(sn.Layers, "\x00")))
		return build.Base{Key: "snapshot:" + hex.EncodeToString(h[:]), Layers: sn.Layers, Config: sn.RunConfig}, nil
	}
	if !errdefs.IsNotFound(err) {
		return build.Base{}, err
	}
	img, err := w.m.cfg.Images.Resolve(ctx, w.ws, ref, nil, nil)
	if err != nil {
		return build.Base{}, err
	}
	return build.Base{Key: img.Digest, Layers: img.Layers, Config: img.Config, Release: img.Release}, nil
}

// Run boots a build sandbox over layers — the workspace's egress policy,
// the default runtime and limits, no record — runs spec in it and captures its upper
// dir. The sandbox is gone when Run returns.
func (w *buildWorker) Run(ctx context.Context, layers []string, spec build.RunSpec, out io.Writer) (build.Layer, error) {
	m := w.m
	id := uuid.NewString()
	rid := runtimeID(id)
	defer m.holdTransient(rid)()
	var undo cleanup.Stack
	defer undo.Run(context.WithoutCancel(ctx))
	undo.Push(func(ctx context.Context) error { return m.cfg.Storage.Remove(ctx, rid) })
	lim := m.cfg.Limits
	ident := identity{driver: m.rt.def(), id: id, workspace: w.ws, name: "build-" + rid[:12], hostname: "buildkitsandbox", token: randomHex(32),
		limits: runtime.Limits{MilliCPUs: lim.DefaultVCPUs * 1000, MemBytes: lim.DefaultMemBytes, PidsMax: lim.PidsMax}}
	inst, err := m.prepare(ctx, &undo, &store.Snapshot{Layers: layers}, false, "", ident, lim.DefaultFSBytes)
	if err != nil {
		return build.Layer{}, fmt.Errorf("boot build sandbox: %w", err)
	}
	rc := spec.Config.Layer(nil)
	if rc.WorkDir == "" {
		rc.WorkDir = "/"
	}
	secs := int64(buildStepTimeout / time.Second)
	code, err := inst.client.Exec(ctx, protocol.ExecFrame{Command: spec.Command, Shell: spec.Shell, RunConfig: &rc,
		CloseStdin: true, TimeoutSeconds: &secs, IdleTimeoutSeconds: &secs}, out, out)
	if err != nil {
		return build.Layer{}, err
	}
	if code != 0 {
		return build.Layer{}, &build.ExitError{Code: code}
	}
	if err := m.cfg.Storage.Flush(ctx, rid); err != nil {
		return build.Layer{}, err
	}
	path, err := m.cfg.Storage.Capture(ctx, rid, id)
	if err != nil {
		return build.Layer{}, err
	}
	m.cfg.Faults.Hit(fault.BuildStepCaptured)
	return build.Layer{ID: id, Path: path}, nil
}

// Layer writes a layer with fill into a fresh upper dir, no sandbox.
func (w *buildWorker) Layer(ctx context.Context, fill func(*os.Root) error) (build.Layer, error) {
	st := w.m.cfg.Storage
	id := uuid.NewString()
	rid := runtimeID(id)
	defer w.m.holdTransient(rid)()
	defer st.Remove(context.WithoutCancel(ctx), rid)
	upper, err := st.Prepare(ctx, rid)
	if err != nil {
		return build.Layer{}, err
	}
	root, err := os.OpenRoot(upper)
	if err != nil {
		return build.Layer{}, fmt.Errorf("open layer: %w", err)
	}
	err = fill(root)
	root.Close()
	if err != nil {
		return build.Layer{}, err
	}
	path, err := st.Capture(ctx, rid, id)
	if err != nil {
		return build.Layer{}, err
	}
	return build.Layer{ID: id, Path: path}, nil
}

// Open mounts layers as a rootfs with a throwaway upper until done.
func (w *buildWorker) Open(ctx context.Context, layers []string) (string, func(), error) {
	st := w.m.cfg.Storage
	rid := runtimeID(uuid.NewString())
	release := w.m.holdTransient(rid)
	done := func() {
		ctx := context.WithoutCancel(ctx)
		st.Unmount(ctx, rid)
		st.Remove(ctx, rid)
		release()
	}
	if _, err := st.Prepare(ctx, rid); err != nil {
		done()
		return "", nil, err
	}
	root, err := st.Mount(ctx, rid, layers)
	if err != nil {
		done()
		return "", nil, err
	}
	return root, done, nil
}

// buildCache is build.Cache over the store, for workspace ws.
type buildCache struct {
	m  *Manager
	ws string
}

var _ build.Cache = (*buildCache)(nil)

// Get returns key's layer; an entry whose layer has gone is dropped.
func (c *buildCache) Get(ctx context.Context, key string) (build.Layer, bool, error) {
	e, err := c.m.cfg.Store.GetBuildCache(ctx, c.ws, key)
	if errdefs.IsNotFound(err) {
		return build.Layer{}, false, nil
	}
	if err != nil {
		return build.Layer{}, false, err
	}
	if _, err := os.Stat(e.Layer); err != nil {
		return build.Layer{}, false, c.m.cfg.Store.DeleteBuildCache(ctx, c.ws, key)
	}
	return build.Layer{ID: e.LayerID, Path: e.Layer}, true, nil
}

// Put records l under key with its size.
func (c *buildCache) Put(ctx context.Context, key string, l build.Layer) error {
	var size int64
	filepath.WalkDir(l.Path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				size += info.Size()
			}
		}
		return nil
	})
	now := time.Now().UTC()
	return c.m.cfg.Store.PutBuildCache(ctx, &store.BuildCacheEntry{WorkspaceID: c.ws, Key: key, LayerID: l.ID, Layer: l.Path,
		SizeBytes: size, CreatedAt: now, UsedAt: now})
}

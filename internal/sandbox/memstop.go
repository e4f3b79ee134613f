package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// Memory-preserving stop (preserve_memory_on_stop).
//
// A sandbox with the flag set is checkpointed, not just killed, by every
// stop that is asked for (the stop API, the idle reaper): its memory image
// goes to Storage.MemoryDir(sandbox id) — ids of sandboxes and snapshots
// are distinct UUIDs — laid out as a memory snapshot's is (image/, then
// tokenFile, written last and atomically, marking it complete), and the
// paused instance is then stopped as usual. The next boot of the stopped
// sandbox (start, or the wake of a dataplane or service-URL request)
// restores it over the same upper dir, so its processes continue; the
// restored agent's token is replaced as a memory snapshot's is (waitAgent).
//
// An image lives from its stop to the sandbox's next boot, whatever that
// boot does (a restore consumes it, a cold boot makes it stale), and goes
// with a reset, a delete and the next checkpoint. A sandbox that dies
// keeps no memory (that is halt, not stop). Crashes: the image is not
// fsynced, so it survives the daemon (kill -9 while the sandbox is stopped
// keeps it usable), not the host. A daemon killed during the checkpoint
// leaves no tokenFile, so no image (the next boot is cold and removes the
// rest); one killed after the tokenFile but before the halt leaves the
// instance paused since the checkpoint, so the next daemon's recovery
// stops it and the image, still matching the files, is restored.
//
// restore_memory (create and start) picks, for one boot, what happens to
// the image it would restore (a memory snapshot's on a first boot, a
// memory-preserving stop's on a restart): nil restores it when there is
// one — a failed restore of a stop's image then boots cold, saying so in
// the status message — true requires one and fails the boot rather than
// boot cold, false boots cold.

// restoreMemoryKey is the context key of a request's restore_memory.
type restoreMemoryKey struct{}

// WithRestoreMemory returns ctx carrying a request's restore_memory (nil:
// restore when there is an image) to the boot it causes. It rides the
// context because every path that boots — create, start, and the
// dataplane and gateway wake-ups, which never set it — shares one boot.
func WithRestoreMemory(ctx context.Context, restore *bool) context.Context {
	if restore == nil {
		return ctx
	}
	return context.WithValue(ctx, restoreMemoryKey{}, *restore)
}

// RestoreMemory is the restore_memory ctx carries (WithRestoreMemory), or nil.
func RestoreMemory(ctx context.Context) *bool {
	if v, ok := ctx.Value(restoreMemoryKey{}).(bool); ok {
		return &v
	}
	return nil
}

// checkPreserveMemory refuses preserve_memory_on_stop: true on a runtime
// d that cannot checkpoint.
func checkPreserveMemory(d runtime.Driver, preserve *bool) error {
	if preserve == nil || !*preserve {
		return nil
	}
	if _, ok := d.(runtime.Checkpointer); !ok {
		return errdefs.Field("preserve_memory_on_stop", "the %s runtime cannot checkpoint a sandbox's memory", d.Name())
	}
	return nil
}

// completeMemory reports whether dir holds a complete memory image that
// runtime d can restore.
func completeMemory(d runtime.Driver, dir string) bool {
	if _, ok := d.(runtime.Checkpointer); !ok {
		return false
	}
	if r := imageRuntime(dir); r != "" && r != d.Name() {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, tokenFile))
	return err == nil
}

// stopMemoryDir is where sandbox id's memory-preserving stop keeps its image.
func (m *Manager) stopMemoryDir(id string) string { return m.cfg.Storage.MemoryDir(id) }

// discardMemory deletes sandbox id's stop image, if any.
func (m *Manager) discardMemory(id string) {
	if err := os.RemoveAll(m.stopMemoryDir(id)); err != nil {
		m.log.Warn("remove stopped sandbox's memory image", "sandbox", id, "err", err)
	}
}

// bootMemory is what one boot restores.
type bootMemory struct {
	dir      string // the memory image's dir (image/ and tokenFile); "" boots cold
	fallback bool   // a failed restore boots cold instead of failing
}

// bootMemoryOf decides what booting sb restores: on its first boot the
// memory snapshot sn's image, on a restart its stop image, as ctx's
// restore_memory says. A required image that is missing is ErrConflict.
func (m *Manager) bootMemoryOf(ctx context.Context, d runtime.Driver, sb *store.Sandbox, sn *store.Snapshot, first bool) (bootMemory, error) {
	want := RestoreMemory(ctx)
	if first {
		return m.snapshotMemory(d, sn, want)
	}
	if want != nil && !*want {
		return bootMemory{}, nil
	}
	if dir := m.stopMemoryDir(sb.ID); completeMemory(d, dir) {
		return bootMemory{dir: dir, fallback: want == nil}, nil
	}
	if want != nil {
		return bootMemory{}, fmt.Errorf("sandbox %s has no memory image to restore (restore_memory: true; it is kept only by a stop with preserve_memory_on_stop): %w", sb.Name, errdefs.ErrConflict)
	}
	return bootMemory{}, nil
}

// snapshotMemory decides what a first boot from sn on runtime d
// restores, as restore_memory want says.
func (m *Manager) snapshotMemory(d runtime.Driver, sn *store.Snapshot, want *bool) (bootMemory, error) {
	if want != nil && !*want {
		return bootMemory{}, nil
	}
	if dir, ok := m.memoryImage(d, sn); ok {
		return bootMemory{dir: dir}, nil
	}
	if want != nil {
		return bootMemory{}, fmt.Errorf("snapshot %s has no memory image to restore (restore_memory: true): %w", sn.Name, errdefs.ErrConflict)
	}
	return bootMemory{}, nil
}

// stop is the stop a caller asks for (the stop API, the idle reaper): with
// preserve_memory_on_stop, sb's memory is checkpointed first, and a
// checkpoint that fails leaves a plain stop that says so. Callers hold
// sb's lock.
func (m *Manager) stop(ctx context.Context, sb *store.Sandbox, msg string) error {
	if !sb.PreserveMemoryOnStop {
		return m.halt(ctx, sb, msg)
	}
	m.setAgent(sb.ID, nil)
	t0 := time.Now()
	note := "memory preserved: the next start resumes its processes"
	if err := m.suspend(ctx, sb); err != nil {
		m.log.Warn("memory-preserving stop fell back to a plain stop", "sandbox", sb.ID, "err", err)
		note = "memory not preserved (" + err.Error() + "); the next start boots from its files"
	}
	tHalt := time.Now()
	if msg != "" {
		note = msg + "; " + note
	}
	if err := m.halt(ctx, sb, note); err != nil {
		return err
	}
	m.log.Info("sandbox stopped", "sandbox", sb.ID, "name", sb.Name, "checkpoint", tHalt.Sub(t0), "halt", time.Since(tHalt))
	return nil
}

// suspend checkpoints ready sb's memory into its stop image, replacing any
// earlier one, and leaves the instance ended for halt to tear down. The image
// is complete only once tokenFile (the running agent's token, which the
// restored agent holds) is renamed into place; on failure none is left.
func (m *Manager) suspend(ctx context.Context, sb *store.Sandbox) error {
	d, err := m.driverOf(sb)
	if err != nil {
		return err
	}
	ckpt, ok := d.(runtime.Checkpointer)
	if !ok {
		return fmt.Errorf("the %s runtime cannot checkpoint", d.Name())
	}
	dir := m.stopMemoryDir(sb.ID)
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove old memory image: %w", err)
	}
	image := filepath.Join(dir, memoryImageDir)
	if err := os.MkdirAll(image, 0o700); err != nil {
		return fmt.Errorf("memory image dir: %w", err)
	}
	// A client that gives up on its stop must not cost the sandbox its
	// memory half way: the checkpoint runs to its end.
	err = ckpt.Suspend(context.WithoutCancel(ctx), runtimeID(sb.ID), image)
	if err == nil {
		err = writeFileAtomic(filepath.Join(dir, tokenFile), []byte(sb.Token))
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// writeFileAtomic writes path through a temporary file renamed over it,
// so path is either absent or whole.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

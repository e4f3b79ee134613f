package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Checkpointer = (*Driver)(nil)

// Memory snapshots.
//
// Checkpoint stops the sandbox inside the Sentry (Pause), saves it with
// `runsc checkpoint --leave-running` (which leaves a paused sandbox
// paused) and returns with it still paused, for Resume. Suspend saves it
// with a plain `runsc checkpoint`, which ends it.
//
// Restore runs `runsc restore --image-path` on a fresh bundle. gVisor
// re-opens the root filesystem by path through the new bundle's gofer, so
// the rootfs may be another mount showing the same files (a branch's
// overlay over the captured layer), and it takes over the new netns'
// interfaces and addresses as `run` does: a restored sandbox answers on
// its new address, its sockets bound to 0.0.0.0 keep listening and
// connections open at the checkpoint are dead. /tmp is gVisor's own tmpfs
// and travels inside the image.

// Files the driver keeps in the image dir: hostnameFile (the source's UTS
// hostname, which the restored kernel keeps, so that the restored sandbox's
// /etc/hosts names it) and savedFile (the parts of the source's OCI config
// that runsc requires unchanged on restore and that follow the source's
// mem_bytes, not the restored sandbox's: tmpfs sizes and rlimits).
const (
	hostnameFile = "cubicle-hostname"
	savedFile    = "cubicle-restore-spec.json"
)

// Checkpoint saves sandbox id's memory image into dir and returns with the
// sandbox paused (see runtime.Checkpointer); call Resume afterwards.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string) error {
	return d.save(ctx, id, dir, true)
}

// Suspend saves sandbox id's memory image into dir and lets runsc end the
// sandbox with the save (see runtime.Checkpointer); call Stop afterwards.
// It leaves suspendedFile in the bundle, so that Stop does not signal a
// sandbox that is gone.
func (d *Driver) Suspend(ctx context.Context, id, dir string) error {
	return d.save(ctx, id, dir, false)
}

// suspendedFile marks a bundle whose sandbox ended with its checkpoint.
const suspendedFile = "cubicle-suspended"

// save writes dir's driver files and runs `runsc checkpoint`: with
// leaveRunning, of the paused sandbox (it stays paused); without, of the
// running one, which the save ends.
func (d *Driver) save(ctx context.Context, id, dir string, leaveRunning bool) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("checkpoint sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	bundle := d.bundleDir(id)
	cfg, err := bundleConfig(bundle)
	if err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, hostnameFile), []byte(cfg.Hostname), 0o600); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	b, err := json.Marshal(savedSpecOf(cfg))
	if err != nil {
		return fmt.Errorf("checkpoint sandbox %s: encode restore spec: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, savedFile), b, 0o600); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	args := []string{"checkpoint", "--image-path", dir}
	if leaveRunning {
		if err := d.Pause(ctx, id); err != nil {
			return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
		}
		args = append(args, "--leave-running")
	}
	_, err = d.run(ctx, append(args, id)...)
	if !leaveRunning {
		// Marked even on failure: a failed save may have ended it too,
		// and Stop's delete --force ends it in any case.
		if merr := os.WriteFile(filepath.Join(bundle, suspendedFile), nil, 0o600); merr != nil && err == nil {
			err = merr
		}
	}
	if err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	return nil
}

// Restore starts sandbox spec.ID from the checkpoint image in dir instead
// of booting it (see runtime.Checkpointer). Failures leave nothing behind,
// as with Start.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	if b, err := os.ReadFile(filepath.Join(dir, hostnameFile)); err == nil {
		spec.Hostname = string(b)
	} else {
		return fmt.Errorf("restore sandbox %s: not a checkpoint image: %w: %w", spec.ID, errdefs.ErrInvalid, err)
	}
	return d.launch(ctx, spec, dir)
}

// bundleConfig reads the bundle's config.json (written by the daemon).
func bundleConfig(bundle string) (*specs.Spec, error) {
	b, err := os.ReadFile(filepath.Join(bundle, configFile))
	if err != nil {
		return nil, fmt.Errorf("read OCI config: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decode OCI config: %w", err)
	}
	return &s, nil
}

// savedSpec is what a restore takes from its checkpoint's OCI config.
type savedSpec struct {
	Tmpfs   []specs.Mount       `json:"tmpfs"`
	Rlimits []specs.POSIXRlimit `json:"rlimits"`
	// Docker is the source's runtime.Spec.Docker: its processes hold the
	// capabilities and sockets it granted, so the restore keeps it.
	Docker bool `json:"docker,omitempty"`
}

// savedSpecOf picks what a restore must keep from a source's OCI config.
func savedSpecOf(cfg *specs.Spec) savedSpec {
	saved := savedSpec{Tmpfs: []specs.Mount{}, Rlimits: cfg.Process.Rlimits, Docker: cfg.Annotations[dockerAnnotation] == "true"}
	for _, m := range cfg.Mounts {
		if m.Type == "tmpfs" && m.Destination != "/dev" {
			saved.Tmpfs = append(saved.Tmpfs, m)
		}
	}
	return saved
}

// checkpointSpec returns the spec parts saved with the checkpoint image in
// dir, or nil (derived from the runtime spec) for a cold boot (dir "") and
// for images saved before they were recorded.
func checkpointSpec(dir string) (*savedSpec, error) {
	if dir == "" {
		return nil, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, savedFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint restore spec: %w", err)
	}
	var saved savedSpec
	if err := json.Unmarshal(b, &saved); err != nil {
		return nil, fmt.Errorf("decode checkpoint restore spec: %w", err)
	}
	return &saved, nil
}

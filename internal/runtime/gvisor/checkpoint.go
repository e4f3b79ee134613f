package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Checkpointer = (*Driver)(nil)

// Memory snapshots.
//
// Checkpoint stops the sandbox inside the Sentry (`runsc pause`), saves it
// with `runsc checkpoint --leave-running` (which leaves a paused sandbox
// paused) and returns with it still paused; Resume then sees the marker
// file pausedFile and answers with `runsc resume` instead of thawing the
// cgroup freezer. The cgroup freezer cannot be used here: a frozen Sentry
// cannot save itself.
//
// Restore runs `runsc restore --image-path` on a fresh bundle. gVisor
// re-opens the root filesystem by path through the new bundle's gofer, so
// the rootfs may be another mount showing the same files (a branch's
// overlay over the captured layer), and it takes over the new netns'
// interfaces and addresses as `run` does: a restored sandbox answers on
// its new address, its sockets bound to 0.0.0.0 keep listening and
// connections open at the checkpoint are dead. /tmp is gVisor's own tmpfs
// and travels inside the image.

// Files the driver keeps: pausedFile in the bundle dir while a Checkpoint
// holds the sandbox paused; hostnameFile in the image dir (the source's UTS
// hostname, which the restored kernel keeps, so that the restored sandbox's
// /etc/hosts names it).
const (
	pausedFile   = "paused-for-checkpoint"
	hostnameFile = "cubicle-hostname"
)

// Checkpoint saves sandbox id's memory image into dir and returns with the
// sandbox paused (see runtime.Checkpointer); call Resume afterwards.
func (d *Driver) Checkpoint(ctx context.Context, id, dir string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("checkpoint sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	bundle := d.bundleDir(id)
	hostname, err := bundleHostname(bundle)
	if err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(dir, hostnameFile), []byte(hostname), 0o600); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	// The marker goes first, so that Resume undoes a pause that happened
	// whatever fails afterwards.
	if err := os.WriteFile(filepath.Join(bundle, pausedFile), nil, 0o600); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	if _, err := d.run(ctx, "pause", id); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: pause: %w", id, err)
	}
	if _, err := d.run(ctx, "checkpoint", "--image-path", dir, "--leave-running", id); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: %w", id, err)
	}
	return nil
}

// resumeCheckpointed undoes Checkpoint's pause. ok is false when sandbox id
// was not paused by Checkpoint.
func (d *Driver) resumeCheckpointed(ctx context.Context, id string) (ok bool, err error) {
	marker := filepath.Join(d.bundleDir(id), pausedFile)
	if _, err := os.Stat(marker); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if _, err := d.run(ctx, "resume", id); err != nil && !strings.Contains(err.Error(), "not paused") {
		return true, err
	}
	return true, os.Remove(marker)
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

// bundleHostname reads the UTS hostname from the bundle's config.json.
func bundleHostname(bundle string) (string, error) {
	b, err := os.ReadFile(filepath.Join(bundle, configFile))
	if err != nil {
		return "", fmt.Errorf("read OCI config: %w", err)
	}
	var s specs.Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return "", fmt.Errorf("decode OCI config: %w", err)
	}
	return s.Hostname, nil
}

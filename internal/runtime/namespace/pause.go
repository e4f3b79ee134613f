package namespace

import (
	"context"
	"fmt"
	"os"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

var _ runtime.Pauser = (*Driver)(nil)

// Pause freezes every process of sandbox id through its freezer cgroup.
func (d *Driver) Pause(ctx context.Context, id string) error {
	dir, err := d.freezerDir(id)
	if err != nil {
		return err
	}
	if err := runtime.Freeze(ctx, dir, true); err != nil {
		// Never leave a half-frozen sandbox behind.
		runtime.Freeze(context.WithoutCancel(ctx), dir, false)
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// Resume thaws sandbox id.
func (d *Driver) Resume(ctx context.Context, id string) error {
	dir, err := d.freezerDir(id)
	if err != nil {
		return err
	}
	if err := runtime.Freeze(ctx, dir, false); err != nil {
		return fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	return nil
}

func (d *Driver) freezerDir(id string) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	for _, cd := range d.cgroupsFor(id).dirs {
		if cd.ctrl == "freezer" {
			if _, err := os.Stat(cd.path); err != nil {
				return "", fmt.Errorf("sandbox %s has no freezer cgroup: %w", id, err)
			}
			return cd.path, nil
		}
	}
	return "", fmt.Errorf("sandbox %s: the host has no cgroup v1 freezer", id)
}

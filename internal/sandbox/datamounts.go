package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// DataMounts serves sandboxes' mount_config (spec §4.5): buckets and git
// repositories the daemon serves on its side and the runtime binds in.
// internal/mounts.Service implements it; the manager only says when a
// sandbox's mounts must be up (from before its runtime starts until after
// it stops) and knows nothing of how they are served.
type DataMounts interface {
	// Validate checks a raw mount_config (errdefs.FieldErrors) against
	// the sandbox's proxy_config, and that p may use every workspace
	// secret it references; it returns the mounts' paths in order.
	Validate(ctx context.Context, p auth.Principal, mountConfig, proxyConfig []byte) (paths []string, err error)
	// Up serves sandbox id's mounts (afresh if they were up) and returns
	// the binds for its runtime.
	Up(ctx context.Context, id, workspace string, mountConfig, proxyConfig []byte) ([]runtime.Mount, error)
	// Down stops serving them, writing back what is pending. Idempotent.
	Down(ctx context.Context, id string) error
	// Remove is Down plus deleting their caches and clones.
	Remove(ctx context.Context, id string) error
	// Health is the line for the sandbox's status message, beginning
	// "mounts: " ("" when it has none).
	Health(id string) string
}

// errMountsGone marks a running sandbox found after a daemon restart whose
// data mounts were served by the previous daemon: their binds are dead,
// so recovery restarts it rather than re-adopting it.
var errMountsGone = errors.New("its data mounts were served by the previous daemon")

// validateMounts checks a create's mount_config for the caller in ctx,
// refusing one the daemon cannot serve, and returns its mount paths.
func (m *Manager) validateMounts(ctx context.Context, cfg, proxyConfig []byte) ([]string, error) {
	if !hasJSON(cfg) {
		return nil, nil
	}
	if m.cfg.Mounts == nil {
		return nil, errdefs.Field("mount_config", "this server runs without data mounts")
	}
	p, err := principalOf(ctx)
	if err != nil {
		return nil, err
	}
	return m.cfg.Mounts.Validate(ctx, p, cfg, proxyConfig)
}

// dataMounts brings sandbox id's data mounts up for a boot and returns
// the binds its runtime spec gets; every boot path (create, start,
// memory restore, a fork's branches) goes through prepare and so here.
func (m *Manager) dataMounts(ctx context.Context, id identity) ([]runtime.Mount, error) {
	if !hasJSON(id.mountConfig) {
		return nil, nil
	}
	if m.cfg.Mounts == nil {
		return nil, fmt.Errorf("sandbox %s has a mount_config but the server runs without data mounts: %w", id.name, errdefs.ErrUnavailable)
	}
	binds, err := m.cfg.Mounts.Up(ctx, id.id, id.workspace, id.mountConfig, id.proxyConfig)
	if err != nil {
		return nil, &BootError{Err: fmt.Errorf("data mounts: %w", err)}
	}
	return binds, nil
}

// dataMountsDown stops serving sb's mounts once its runtime has stopped;
// remove also drops their caches (the sandbox is being deleted).
func (m *Manager) dataMountsDown(ctx context.Context, sb *store.Sandbox, remove bool) {
	if m.cfg.Mounts == nil || !hasJSON(sb.MountConfig) {
		return
	}
	down := m.cfg.Mounts.Down
	if remove {
		down = m.cfg.Mounts.Remove
	}
	if err := down(ctx, sb.ID); err != nil {
		m.log.Warn("data mounts down", "sandbox", sb.ID, "err", err)
	}
}

// liveMountsHealth puts the current health of ready sb's mounts in its
// status message in place of the line recorded at boot, so a store that
// starts failing shows in GET and /status.
func (m *Manager) liveMountsHealth(sb *store.Sandbox) {
	if statusOf(sb) != Ready || !hasJSON(sb.MountConfig) {
		return
	}
	h := m.mountsHealth(sb.ID)
	if i := strings.Index(sb.StatusMessage, mountsNotePrefix); i >= 0 {
		sb.StatusMessage = sb.StatusMessage[:i] + h
	} else {
		sb.StatusMessage = joinNote(sb.StatusMessage, h)
	}
}

// mountsNotePrefix begins the mounts' line of a status message (what
// DataMounts.Health returns).
const mountsNotePrefix = "mounts: "

// mountsHealth is sb's mounts' line for its status message.
func (m *Manager) mountsHealth(id string) string {
	if m.cfg.Mounts == nil {
		return ""
	}
	return m.cfg.Mounts.Health(id)
}

// mountConfigOf is the stored form of a create's mount_config: nil for
// none.
func mountConfigOf(raw []byte) []byte {
	if !hasJSON(raw) {
		return nil
	}
	return append([]byte(nil), raw...)
}

// joinNote joins status-message parts, skipping empty ones.
func joinNote(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// captureNote is the status message of a capture of sb: a capture holds
// the sandbox's own filesystem, never the data of its mounts, and says so.
func captureNote(sb *store.Sandbox) string {
	if !hasJSON(sb.MountConfig) {
		return ""
	}
	var cfg struct {
		Mounts []struct {
			Type      string `json:"type"`
			MountPath string `json:"mount_path"`
		} `json:"mounts"`
	}
	_ = json.Unmarshal(sb.MountConfig, &cfg) // validated at create
	parts := make([]string, 0, len(cfg.Mounts))
	for _, mt := range cfg.Mounts {
		parts = append(parts, mt.MountPath+" ("+mt.Type+")")
	}
	return "captured without the data of its mounts: " + strings.Join(parts, ", ")
}

// volumesClearOfMounts refuses a volume attachment whose mount path is,
// or is under or over, one of the data mounts' paths.
func volumesClearOfMounts(vols []store.VolumeAttachment, mountPaths []string) error {
	for i, v := range vols {
		for j, d := range mountPaths {
			if runtime.TargetsOverlap(v.MountPath, d) {
				return errdefs.Field(fmt.Sprintf("volumes[%d].mount_path", i), "%s overlaps mount_config.mounts[%d].mount_path %s", v.MountPath, j, d)
			}
		}
	}
	return nil
}

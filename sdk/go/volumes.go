package cubicle

import (
	"context"
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// CreateVolume makes a persistent volume of the workspace: empty, of
// req.SizeBytes, or with req.FromSnapshot a copy-on-write clone of that
// volume snapshot. Attach it with CreateSandboxRequest.Volumes.
func (c *Client) CreateVolume(ctx context.Context, req protocol.CreateVolumeRequest) (*protocol.Volume, error) {
	var v protocol.Volume
	if err := c.do(ctx, http.MethodPost, "/volumes", req, &v); err != nil {
		return nil, fmt.Errorf("create volume %s: %w", req.Name, err)
	}
	return &v, nil
}

// GetVolume returns volume name, with the sandboxes it is attached to.
func (c *Client) GetVolume(ctx context.Context, name string) (*protocol.Volume, error) {
	var v protocol.Volume
	if err := c.do(ctx, http.MethodGet, "/volumes/"+escape(name), nil, &v); err != nil {
		return nil, fmt.Errorf("get volume %s: %w", name, err)
	}
	return &v, nil
}

// ListVolumes lists the workspace's volumes, by name.
func (c *Client) ListVolumes(ctx context.Context) ([]protocol.Volume, error) {
	var l protocol.VolumeList
	if err := c.do(ctx, http.MethodGet, "/volumes", nil, &l); err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return l.Volumes, nil
}

// DeleteVolume deletes volume name and its data. It fails with a conflict
// (IsConflict) while a sandbox has it attached.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, "/volumes/"+escape(name), nil, nil); err != nil {
		return fmt.Errorf("delete volume %s: %w", name, err)
	}
	return nil
}

// SnapshotVolume takes read-only snapshot snapshot of volume name.
func (c *Client) SnapshotVolume(ctx context.Context, name, snapshot string) (*protocol.VolumeSnapshot, error) {
	var vs protocol.VolumeSnapshot
	if err := c.do(ctx, http.MethodPost, "/volumes/"+escape(name)+"/snapshot", protocol.SnapshotVolumeRequest{Name: snapshot}, &vs); err != nil {
		return nil, fmt.Errorf("snapshot volume %s: %w", name, err)
	}
	return &vs, nil
}

// ListVolumeSnapshots lists the workspace's volume snapshots, by name.
func (c *Client) ListVolumeSnapshots(ctx context.Context) ([]protocol.VolumeSnapshot, error) {
	var l protocol.VolumeSnapshotList
	if err := c.do(ctx, http.MethodGet, "/volume-snapshots", nil, &l); err != nil {
		return nil, fmt.Errorf("list volume snapshots: %w", err)
	}
	return l.Snapshots, nil
}

// DeleteVolumeSnapshot deletes volume snapshot name; volumes cloned from
// it keep their data.
func (c *Client) DeleteVolumeSnapshot(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, "/volume-snapshots/"+escape(name), nil, nil); err != nil {
		return fmt.Errorf("delete volume snapshot %s: %w", name, err)
	}
	return nil
}

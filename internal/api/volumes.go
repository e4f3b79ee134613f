package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Volumes is what the volume routes call on the sandbox manager.
type Volumes interface {
	CreateVolume(ctx context.Context, req protocol.CreateVolumeRequest) (*sandbox.VolumeView, error)
	GetVolume(ctx context.Context, name string) (*sandbox.VolumeView, error)
	ListVolumes(ctx context.Context) ([]*sandbox.VolumeView, error)
	DeleteVolume(ctx context.Context, name string) error
	SnapshotVolume(ctx context.Context, name string, req protocol.SnapshotVolumeRequest) (*sandbox.VolumeSnapshotView, error)
	ListVolumeSnapshots(ctx context.Context) ([]*sandbox.VolumeSnapshotView, error)
	DeleteVolumeSnapshot(ctx context.Context, name string) error
}

var _ Volumes = (*sandbox.Manager)(nil)

// EnableVolumes serves persistent volumes (a Cubicle extension) from v
// under every control-plane prefix: /volumes (create, clone with
// from_snapshot, list, get, delete — 409 while attached), their
// snapshots (POST /volumes/{name}/snapshot) and /volume-snapshots (list,
// delete). Call it before serving.
func (s *Server) EnableVolumes(v Volumes) {
	for _, p := range prefixes {
		s.handle("POST "+p+"/volumes", jsonHandler(http.StatusCreated, nil, gated(s, func(r *http.Request, req protocol.CreateVolumeRequest) (protocol.Volume, error) {
			view, err := v.CreateVolume(r.Context(), req)
			if err != nil {
				return protocol.Volume{}, err
			}
			return volumeJSON(view), nil
		})))
		s.handle("GET "+p+"/volumes", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (protocol.VolumeList, error) {
			list, err := v.ListVolumes(r.Context())
			if err != nil {
				return protocol.VolumeList{}, err
			}
			out := protocol.VolumeList{Volumes: make([]protocol.Volume, len(list))}
			for i, view := range list {
				out.Volumes[i] = volumeJSON(view)
			}
			return out, nil
		}))
		s.handle("GET "+p+"/volumes/{name}", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (protocol.Volume, error) {
			view, err := v.GetVolume(r.Context(), r.PathValue("name"))
			if err != nil {
				return protocol.Volume{}, err
			}
			return volumeJSON(view), nil
		}))
		s.handle("DELETE "+p+"/volumes/{name}", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (noContent, error) {
			return noContent{}, v.DeleteVolume(r.Context(), r.PathValue("name"))
		}))
		s.handle("POST "+p+"/volumes/{name}/snapshot", jsonHandler(http.StatusCreated, nil, gated(s, func(r *http.Request, req protocol.SnapshotVolumeRequest) (protocol.VolumeSnapshot, error) {
			view, err := v.SnapshotVolume(r.Context(), r.PathValue("name"), req)
			if err != nil {
				return protocol.VolumeSnapshot{}, err
			}
			return volumeSnapshotJSON(view), nil
		})))
		s.handle("GET "+p+"/volume-snapshots", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (protocol.VolumeSnapshotList, error) {
			list, err := v.ListVolumeSnapshots(r.Context())
			if err != nil {
				return protocol.VolumeSnapshotList{}, err
			}
			out := protocol.VolumeSnapshotList{Snapshots: make([]protocol.VolumeSnapshot, len(list))}
			for i, view := range list {
				out.Snapshots[i] = volumeSnapshotJSON(view)
			}
			return out, nil
		}))
		s.handle("DELETE "+p+"/volume-snapshots/{name}", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (noContent, error) {
			return noContent{}, v.DeleteVolumeSnapshot(r.Context(), r.PathValue("name"))
		}))
	}
}

func volumeJSON(v *sandbox.VolumeView) protocol.Volume {
	out := protocol.Volume{ID: v.ID, Name: v.Name, SizeBytes: v.SizeBytes, UsedBytes: v.UsedBytes, FromSnapshot: v.FromSnapshotID,
		CreatedBy: v.CreatedBy, CreatedAt: v.CreatedAt, Attachments: make([]protocol.VolumeUse, len(v.Uses))}
	for i, u := range v.Uses {
		out.Attachments[i] = protocol.VolumeUse{SandboxID: u.SandboxID, SandboxName: u.SandboxName, MountPath: u.MountPath, ReadOnly: u.ReadOnly}
	}
	return out
}

func volumeSnapshotJSON(v *sandbox.VolumeSnapshotView) protocol.VolumeSnapshot {
	return protocol.VolumeSnapshot{ID: v.ID, Name: v.Name, VolumeID: v.VolumeID, VolumeName: v.VolumeName, SizeBytes: v.SizeBytes,
		UsedBytes: v.UsedBytes, CreatedBy: v.CreatedBy, CreatedAt: v.CreatedAt}
}

// sandboxVolumesJSON is sb's attachments on the wire (nil when none, so
// the member is left out).
func sandboxVolumesJSON(sb *store.Sandbox) []protocol.VolumeAttachment {
	if len(sb.Volumes) == 0 {
		return nil
	}
	return sandbox.VolumeAttachments(sb)
}

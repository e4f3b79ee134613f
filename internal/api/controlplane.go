package api

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

func (s *Server) snapshotJSON(v *sandbox.SnapshotView) protocol.Snapshot {
	sn := v.Snapshot
	rc := sn.RunConfig
	return protocol.Snapshot{
		ID: sn.ID, Name: sn.Name, Status: sn.Status, StatusMessage: sn.StatusMessage,
		FSCapacityBytes: sn.FSCapacityBytes, DockerImage: sn.DockerImage, ImageDigest: sn.ImageDigest,
		RegistryID: sn.RegistryID, CreatedBy: sn.CreatedBy, RunConfig: &rc, SourceSandboxID: sn.SourceSandboxID,
		CreatedAt: sn.CreatedAt, UpdatedAt: sn.UpdatedAt,
		PullBytesTotal: v.PullBytesTotal, PullBytesDone: v.PullBytesDone,
		BuildStep: v.BuildStep, BuildPercent: v.BuildPercent,
		Builtin: sn.WorkspaceID == store.BuiltinWorkspace, Packages: sn.Packages,
		Tag: sn.Tag, Labels: labelsOrEmpty(sn.Labels), StartCmd: sn.StartCmd, ReadyCmd: sn.ReadyCmd, Docker: sn.Docker,
	}
}

func (s *Server) sandboxJSON(sb *store.Sandbox) protocol.Sandbox {
	return protocol.Sandbox{
		ID: sb.ID, Name: sb.Name, Status: sb.Status, StatusMessage: sb.StatusMessage,
		DataplaneURL: s.publicURL + "/dp/" + sb.ID, SnapshotID: sb.SnapshotID,
		VCPUs: sb.VCPUs, MemBytes: sb.MemBytes, FSCapacityBytes: sb.FSCapacityBytes,
		IdleTTLSeconds: sb.IdleTTLSeconds, DeleteAfterStopSeconds: sb.DeleteAfterStopSeconds,
		RunConfig: sb.RunConfig, Runtime: sb.Runtime, CreatedBy: sb.CreatedBy,
		CreatedAt: sb.CreatedAt, UpdatedAt: sb.UpdatedAt, StoppedAt: sb.StoppedAt,
		PreserveMemoryOnStop: sb.PreserveMemoryOnStop,
		CPUMillicores:        sb.MilliCPUs(), Labels: labelsOrEmpty(sb.Labels), Persistent: sb.Persistent,
		Volumes: sandboxVolumesJSON(sb),
		Docker:  sb.Docker,
	}
}

// labelsOrEmpty makes labels encode as {} when there are none.
func labelsOrEmpty(labels map[string]string) map[string]string {
	if labels == nil {
		return map[string]string{}
	}
	return labels
}

func (s *Server) createSnapshot(r *http.Request, req protocol.CreateSnapshotRequest) (protocol.Snapshot, error) {
	v, err := s.mgr.CreateSnapshot(r.Context(), req)
	if err != nil {
		return protocol.Snapshot{}, err
	}
	return s.snapshotJSON(v), nil
}

func (s *Server) getSnapshot(r *http.Request, _ none) (protocol.Snapshot, error) {
	v, err := s.mgr.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		return protocol.Snapshot{}, err
	}
	out := s.snapshotJSON(v)
	s.withUsage(r.Context(), nil, nil, v.Snapshot, &out)
	return out, nil
}

func (s *Server) listSnapshots(r *http.Request, _ none) (protocol.SnapshotList, error) {
	o, err := listOptions(r, "snapshots")
	if err != nil {
		return protocol.SnapshotList{}, err
	}
	list, err := s.mgr.ListSnapshots(r.Context(), o.page())
	if err != nil {
		return protocol.SnapshotList{}, err
	}
	list, next := pageOf(o, list, func(v *sandbox.SnapshotView) store.Cursor { return store.SnapshotCursor(v.Snapshot, o.SortBy) })
	out := make([]protocol.Snapshot, len(list))
	for i, v := range list {
		out[i] = s.snapshotJSON(v)
		// Lists leave run_config out (GET /snapshots/{id} has it), so
		// their size does not grow with the images' Env.
		out[i].RunConfig = nil
	}
	return protocol.SnapshotList{Snapshots: out, Items: out, Offset: o.Offset, NextCursor: next}, nil
}

// snapshotTags answers GET /snapshots-by-name/{name}: the tags published
// under name among the snapshots the caller may see, oldest first; a name
// with none the caller may see is a 404.
func (s *Server) snapshotTags(r *http.Request, _ none) (protocol.SnapshotTags, error) {
	name := r.PathValue("name")
	list, err := s.mgr.ListSnapshots(r.Context(), store.ListOptions{Name: name})
	if err != nil {
		return protocol.SnapshotTags{}, err
	}
	if len(list) == 0 {
		return protocol.SnapshotTags{}, fmt.Errorf("snapshot name %q: %w", name, errdefs.ErrNotFound)
	}
	out := protocol.SnapshotTags{Name: name, Tags: []protocol.SnapshotTag{}}
	for _, v := range list {
		if v.Tag != "" {
			out.Tags = append(out.Tags, protocol.SnapshotTag{Tag: v.Tag, SnapshotID: v.ID})
		}
	}
	return out, nil
}

func (s *Server) deleteSnapshot(r *http.Request, _ none) (noContent, error) {
	if err := s.mgr.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		return noContent{}, err
	}
	// The snapshot may have been the last user of layers whose image is
	// gone; freeing them is best effort and never fails the delete.
	if _, err := s.collectImages(r.Context()); err != nil {
		s.log.Warn("image gc after snapshot delete", "err", err)
	}
	return noContent{}, nil
}

// checkCreateSandbox checks the members the manager does not model and
// folds the Python client's snapshot into snapshot_id (which accepts an
// id or a name).
func checkCreateSandbox(req *protocol.CreateSandboxRequest) error {
	if d := req.AccessDelegation; d != nil {
		switch {
		case d.Mode == protocol.DelegationInherit && len(d.Permissions) > 0:
			return errdefs.Field("access_delegation.permissions", "must be empty for mode %s", protocol.DelegationInherit)
		case d.Mode == protocol.DelegationExplicit && len(d.Permissions) == 0:
			return errdefs.Field("access_delegation.permissions", "must be non-empty for mode %s", protocol.DelegationExplicit)
		case d.Mode != protocol.DelegationInherit && d.Mode != protocol.DelegationExplicit:
			return errdefs.Field("access_delegation.mode", "must be %q or %q", protocol.DelegationInherit, protocol.DelegationExplicit)
		}
	}
	if req.Snapshot != "" {
		if req.SnapshotID != "" || req.SnapshotName != "" && req.SnapshotName != req.Snapshot {
			return errdefs.Field("snapshot", "give one of snapshot_id, snapshot and snapshot_name")
		}
		req.SnapshotID, req.SnapshotName, req.Snapshot = req.Snapshot, "", ""
	}
	return nil
}

func (s *Server) createSandbox(r *http.Request, req protocol.CreateSandboxRequest) (protocol.Sandbox, error) {
	return s.sandboxResult(s.mgr.CreateSandbox(r.Context(), req))
}

// sandboxResult encodes what a manager call on one sandbox returned.
func (s *Server) sandboxResult(sb *store.Sandbox, err error) (protocol.Sandbox, error) {
	if err != nil {
		return protocol.Sandbox{}, err
	}
	return s.sandboxJSON(sb), nil
}

func (s *Server) getSandbox(r *http.Request, _ none) (protocol.Sandbox, error) {
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		return protocol.Sandbox{}, err
	}
	out := s.sandboxJSON(sb)
	s.withUsage(r.Context(), sb, &out, nil, nil)
	return out, nil
}

func (s *Server) sandboxStatus(r *http.Request, _ none) (protocol.StatusResponse, error) {
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		return protocol.StatusResponse{}, err
	}
	return protocol.StatusResponse{Status: sb.Status, StatusMessage: sb.StatusMessage}, nil
}

func (s *Server) listSandboxes(r *http.Request, _ none) (protocol.SandboxList, error) {
	o, err := listOptions(r, "sandboxes")
	if err != nil {
		return protocol.SandboxList{}, err
	}
	list, err := s.mgr.ListSandboxes(r.Context(), o.page())
	if err != nil {
		return protocol.SandboxList{}, err
	}
	list, next := pageOf(o, list, func(sb *store.Sandbox) store.Cursor { return store.SandboxCursor(sb, o.SortBy) })
	out := make([]protocol.Sandbox, len(list))
	for i, sb := range list {
		out[i] = s.sandboxJSON(sb)
	}
	return protocol.SandboxList{Sandboxes: out, Items: out, Offset: o.Offset, NextCursor: next}, nil
}

func (s *Server) deleteSandbox(r *http.Request, _ none) (noContent, error) {
	return noContent{}, s.mgr.DeleteSandbox(r.Context(), r.PathValue("name"))
}

// stopSandbox stops a ready sandbox (spec B8) and answers 200 with the
// Sandbox JSON. Stopping a stopped sandbox is a 200 no-op.
func (s *Server) stopSandbox(r *http.Request, _ none) (protocol.Sandbox, error) {
	return s.sandboxResult(s.mgr.StopSandbox(r.Context(), r.PathValue("name")))
}

// startSandbox boots a stopped or failed sandbox (spec B7), blocking until
// it is ready, and answers 200 with the Sandbox JSON. Starting a ready (or
// provisioning) sandbox is a 200 no-op. restore_memory comes in the
// optional body or as a query parameter (not both).
func (s *Server) startSandbox(r *http.Request, req protocol.StartSandboxRequest) (protocol.Sandbox, error) {
	if q := r.URL.Query(); q.Has("restore_memory") {
		v, err := strconv.ParseBool(q.Get("restore_memory"))
		if err != nil {
			return protocol.Sandbox{}, errdefs.Field("restore_memory", "must be true or false")
		}
		if req.RestoreMemory != nil && *req.RestoreMemory != v {
			return protocol.Sandbox{}, errdefs.Field("restore_memory", "the query and the body disagree")
		}
		req.RestoreMemory = &v
	}
	ctx := sandbox.WithRestoreMemory(r.Context(), req.RestoreMemory)
	return s.sandboxResult(s.mgr.StartSandbox(ctx, r.PathValue("name")))
}

// updateSandbox applies a PATCH (spec B4) and answers the Sandbox JSON.
func (s *Server) updateSandbox(r *http.Request, req protocol.UpdateSandboxRequest) (protocol.Sandbox, error) {
	return s.sandboxResult(s.mgr.UpdateSandbox(r.Context(), r.PathValue("name"), req))
}

package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// registerBranchingRoutes adds snapshot capture (spec X1) and Cubicle's
// branching extensions: fork, reset and diff.
func (s *Server) registerBranchingRoutes() {
	for _, p := range prefixes {
		s.handle("POST "+p+"/boxes/{name}/snapshot", jsonHandler(http.StatusCreated, nil, gated(s, s.captureSnapshot)))
		s.handle("POST "+p+"/boxes/{name}/fork", jsonHandler(http.StatusCreated, nil, gated(s, s.forkSandbox)))
		s.handle("POST "+p+"/boxes/{name}/reset", jsonHandler(http.StatusOK, nil, s.resetSandbox))
		s.handle("GET "+p+"/diff", jsonHandler(http.StatusOK, nil, s.diff))
	}
}

// captureSnapshot is X1. The capture is quick (a frozen copy-on-write
// snapshot), so the snapshot comes back ready; the client's poll of
// GET /snapshots/{id} then succeeds at once.
func (s *Server) captureSnapshot(r *http.Request, req protocol.CaptureSnapshotRequest) (protocol.Snapshot, error) {
	v, err := s.mgr.CaptureSnapshot(r.Context(), r.PathValue("name"), req)
	if err != nil {
		return protocol.Snapshot{}, err
	}
	return s.snapshotJSON(v), nil
}

func (s *Server) forkSandbox(r *http.Request, req protocol.ForkRequest) (protocol.ForkResponse, error) {
	res, err := s.mgr.Fork(r.Context(), r.PathValue("name"), req)
	if err != nil {
		return protocol.ForkResponse{}, err
	}
	out := protocol.ForkResponse{SnapshotID: res.Snapshot.ID, Sandboxes: make([]protocol.Sandbox, len(res.Sandboxes))}
	for i, sb := range res.Sandboxes {
		out.Sandboxes[i] = s.sandboxJSON(sb)
	}
	return out, nil
}

func (s *Server) resetSandbox(r *http.Request, req protocol.ResetRequest) (protocol.Sandbox, error) {
	return s.sandboxResult(s.mgr.ResetSandbox(r.Context(), r.PathValue("name"), req.SnapshotID))
}

// diff is GET /diff?a=&b=: what changed going from a to b, each a sandbox
// name or a snapshot id or name.
func (s *Server) diff(r *http.Request, _ none) (protocol.DiffResponse, error) {
	a, b := r.URL.Query().Get("a"), r.URL.Query().Get("b")
	if a == "" || b == "" {
		return protocol.DiffResponse{}, errdefs.Field("a", "both a and b (sandbox names or snapshot ids) are required")
	}
	changes, err := s.mgr.Diff(r.Context(), a, b)
	if err != nil {
		return protocol.DiffResponse{}, err
	}
	out := protocol.DiffResponse{A: a, B: b, Changes: make([]protocol.DiffEntry, len(changes))}
	for i, c := range changes {
		out.Changes[i] = protocol.DiffEntry{Path: c.Path, Kind: c.Kind, SizeBytes: c.Size}
	}
	return out, nil
}

// withUsage fills fs_used_bytes of one sandbox or snapshot response. Usage
// is best effort: a failure to measure leaves the field out.
func (s *Server) withUsage(ctx context.Context, sb *store.Sandbox, sbOut *protocol.Sandbox, sn *store.Snapshot, snOut *protocol.Snapshot) {
	var sbs []*store.Sandbox
	var sns []*store.Snapshot
	if sb != nil {
		sbs = append(sbs, sb)
	}
	if sn != nil {
		sns = append(sns, sn)
	}
	got, err := s.mgr.Usage(ctx, sbs, sns)
	if err != nil {
		s.log.Warn("measure fs usage", "err", err)
		return
	}
	if sb != nil {
		if n, ok := got[sb.ID]; ok {
			sbOut.FSUsedBytes = &n
		}
	}
	if sn != nil {
		if n, ok := got[sn.ID]; ok {
			snOut.FSUsedBytes = &n
		}
	}
}

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
		s.handle("POST "+p+"/boxes/{name}/snapshot", s.captureSnapshot)
		s.handle("POST "+p+"/boxes/{name}/fork", s.forkSandbox)
		s.handle("POST "+p+"/boxes/{name}/reset", s.resetSandbox)
		s.handle("GET "+p+"/diff", s.diff)
	}
}

// captureSnapshot is X1. The capture is quick (a frozen copy-on-write
// snapshot), so the snapshot comes back ready; the client's poll of
// GET /snapshots/{id} then succeeds at once.
func (s *Server) captureSnapshot(w http.ResponseWriter, r *http.Request) {
	var req protocol.CaptureSnapshotRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	v, err := s.mgr.CaptureSnapshot(r.Context(), r.PathValue("name"), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.snapshotJSON(v))
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) {
	var req protocol.ForkRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	res, err := s.mgr.Fork(r.Context(), r.PathValue("name"), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := protocol.ForkResponse{SnapshotID: res.Snapshot.ID, Sandboxes: make([]protocol.Sandbox, len(res.Sandboxes))}
	for i, sb := range res.Sandboxes {
		out.Sandboxes[i] = s.sandboxJSON(sb)
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) resetSandbox(w http.ResponseWriter, r *http.Request) {
	var req protocol.ResetRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	sb, err := s.mgr.ResetSandbox(r.Context(), r.PathValue("name"), req.SnapshotID)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
}

// diff is GET /diff?a=&b=: what changed going from a to b, each a sandbox
// name or a snapshot id or name.
func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	a, b := r.URL.Query().Get("a"), r.URL.Query().Get("b")
	if a == "" || b == "" {
		writeError(r.Context(), w, errdefs.Field("a", "both a and b (sandbox names or snapshot ids) are required"))
		return
	}
	changes, err := s.mgr.Diff(r.Context(), a, b)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := protocol.DiffResponse{A: a, B: b, Changes: make([]protocol.DiffEntry, len(changes))}
	for i, c := range changes {
		out.Changes[i] = protocol.DiffEntry{Path: c.Path, Kind: c.Kind, SizeBytes: c.Size}
	}
	writeJSON(w, http.StatusOK, out)
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

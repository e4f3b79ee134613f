package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// maxBody bounds control-plane request bodies.
const maxBody = 1 << 20

// decode reads a JSON body into v; malformed JSON is a 422, a body over
// maxBody a 413.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		var te *json.UnmarshalTypeError
		var me *http.MaxBytesError
		if errors.As(err, &me) {
			return fmt.Errorf("request body over %d bytes: %w", maxBody, errdefs.ErrTooLarge)
		}
		if errors.As(err, &te) {
			if te.Field == "" {
				return fmt.Errorf("request body must be a JSON object: %w", errdefs.ErrInvalid)
			}
			return errdefs.Field(te.Field, "must be of type %s", te.Type)
		}
		return fmt.Errorf("decode request body: %v: %w", err, errdefs.ErrInvalid)
	}
	return nil
}

func (s *Server) snapshotJSON(v *sandbox.SnapshotView) protocol.Snapshot {
	sn := v.Snapshot
	rc := sn.RunConfig
	return protocol.Snapshot{
		ID: sn.ID, Name: sn.Name, Status: sn.Status, StatusMessage: sn.StatusMessage,
		FSCapacityBytes: sn.FSCapacityBytes, DockerImage: sn.DockerImage, ImageDigest: sn.ImageDigest,
		RegistryID: sn.RegistryID, CreatedBy: sn.CreatedBy, RunConfig: &rc, SourceSandboxID: sn.SourceSandboxID,
		CreatedAt: sn.CreatedAt, UpdatedAt: sn.UpdatedAt,
		PullBytesTotal: v.PullBytesTotal, PullBytesDone: v.PullBytesDone,
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
	}
}

// listOptions parses name_contains, limit (1..500, default 50) and offset.
func listOptions(r *http.Request) (store.ListOptions, error) {
	q := r.URL.Query()
	o := store.ListOptions{NameContains: q.Get("name_contains"), Limit: 50}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return o, errdefs.Field("limit", "must be an integer between 1 and 500")
		}
		o.Limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return o, errdefs.Field("offset", "must be a non-negative integer")
		}
		o.Offset = n
	}
	return o, nil
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req protocol.CreateSnapshotRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	v, err := s.mgr.CreateSnapshot(r.Context(), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.snapshotJSON(v))
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	v, err := s.mgr.GetSnapshot(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := s.snapshotJSON(v)
	s.withUsage(r.Context(), nil, nil, v.Snapshot, &out)
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	o, err := listOptions(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	list, err := s.mgr.ListSnapshots(r.Context(), o)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := make([]protocol.Snapshot, len(list))
	for i, v := range list {
		out[i] = s.snapshotJSON(v)
		// Lists leave run_config out (GET /snapshots/{id} has it), so
		// their size does not grow with the images' Env.
		out[i].RunConfig = nil
	}
	writeJSON(w, http.StatusOK, protocol.SnapshotList{Snapshots: out, Items: out, Offset: o.Offset, NextCursor: nextCursor(o, len(out))})
}

// nextCursor is the offset of the next page as a string, or nil on the last.
func nextCursor(o store.ListOptions, n int) *string {
	if n < o.Limit {
		return nil
	}
	c := strconv.Itoa(o.Offset + n)
	return &c
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.DeleteSnapshot(r.Context(), r.PathValue("id")); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	// The snapshot may have been the last user of layers whose image is
	// gone; freeing them is best effort and never fails the delete.
	if _, err := s.collectImages(r.Context()); err != nil {
		s.log.Warn("image gc after snapshot delete", "err", err)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req protocol.CreateSandboxRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	sb, err := s.mgr.CreateSandbox(r.Context(), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandboxJSON(sb))
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := s.sandboxJSON(sb)
	s.withUsage(r.Context(), sb, &out, nil, nil)
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) sandboxStatus(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, protocol.StatusResponse{Status: sb.Status, StatusMessage: sb.StatusMessage})
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	o, err := listOptions(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	list, err := s.mgr.ListSandboxes(r.Context(), o)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	out := make([]protocol.Sandbox, len(list))
	for i, sb := range list {
		out[i] = s.sandboxJSON(sb)
	}
	writeJSON(w, http.StatusOK, protocol.SandboxList{Sandboxes: out, Items: out, Offset: o.Offset, NextCursor: nextCursor(o, len(out))})
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.DeleteSandbox(r.Context(), r.PathValue("name")); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// stopSandbox stops a ready sandbox (spec B8) and answers 200 with the
// Sandbox JSON. Stopping a stopped sandbox is a 200 no-op.
func (s *Server) stopSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.StopSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
}

// startSandbox boots a stopped or failed sandbox (spec B7), blocking until
// it is ready, and answers 200 with the Sandbox JSON. Starting a ready (or
// provisioning) sandbox is a 200 no-op.
func (s *Server) startSandbox(w http.ResponseWriter, r *http.Request) {
	sb, err := s.mgr.StartSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
}

// updateSandbox applies a PATCH (spec B4) and answers the Sandbox JSON.
func (s *Server) updateSandbox(w http.ResponseWriter, r *http.Request) {
	var req protocol.UpdateSandboxRequest
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	sb, err := s.mgr.UpdateSandbox(r.Context(), r.PathValue("name"), req)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.sandboxJSON(sb))
}

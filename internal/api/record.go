package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// The audit routes read sandboxes' records (internal/record). Whoever can
// see a sandbox can read its record, by name; a workspace admin can also
// read a record by sandbox id, which outlives the sandbox.
func (s *Server) registerRecordRoutes() {
	if s.rec == nil {
		return
	}
	for _, p := range prefixes {
		s.handle("GET "+p+"/boxes/{name}/audit", s.boxAudit)
		s.handle("GET "+p+"/boxes/{name}/audit/steps/{step}", s.boxAuditStep)
		s.handle("GET "+p+"/audit/sandboxes/{id}", s.idAudit)
		s.handle("GET "+p+"/audit/sandboxes/{id}/steps/{step}", s.idAuditStep)
	}
}

// Bounds of one audit page.
const (
	auditDefaultLimit = 100
	auditMaxLimit     = 1000
	// followPage is the page a live follow catches up with.
	followPage = 500
	// followKeepAlive is how often an idle live follow sends a comment,
	// so proxies do not time it out.
	followKeepAlive = 15 * time.Second
)

var auditKinds = []string{protocol.KindLifecycle, protocol.KindCommand, protocol.KindFile, protocol.KindNetwork, protocol.KindPackage}

// auditParams is a parsed audit query.
type auditParams struct {
	q      store.AuditQuery
	follow bool
}

// parseAudit reads since_seq, kinds, step, limit and follow (and
// Last-Event-ID, which a reconnecting EventSource sends, as since_seq).
func parseAudit(r *http.Request) (auditParams, error) {
	v := r.URL.Query()
	p := auditParams{q: store.AuditQuery{Limit: auditDefaultLimit}}
	since := v.Get("since_seq")
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		since = id
	}
	if since != "" {
		n, err := strconv.ParseInt(since, 10, 64)
		if err != nil || n < 0 {
			return p, errdefs.Field("since_seq", "must be a non-negative integer")
		}
		p.q.SinceSeq = n
	}
	if k := v.Get("kinds"); k != "" {
		for _, kind := range strings.Split(k, ",") {
			if !slices.Contains(auditKinds, kind) {
				return p, errdefs.Field("kinds", "unknown kind %q (want a comma-separated list of %s)", kind, strings.Join(auditKinds, ", "))
			}
			p.q.Kinds = append(p.q.Kinds, kind)
		}
	}
	if st := v.Get("step"); st != "" {
		n, err := strconv.ParseInt(st, 10, 64)
		if err != nil || n < 1 {
			return p, errdefs.Field("step", "must be a positive integer")
		}
		p.q.Step = n
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > auditMaxLimit {
			return p, errdefs.Field("limit", "must be an integer between 1 and %d", auditMaxLimit)
		}
		p.q.Limit = n
	}
	if f := v.Get("follow"); f != "" {
		b, err := strconv.ParseBool(f)
		if err != nil {
			return p, errdefs.Field("follow", "must be true or false")
		}
		p.follow = b
	}
	return p, nil
}

// boxSandboxID is the id of the sandbox the request names, if the caller
// may see it (the manager decides).
func (s *Server) boxSandboxID(r *http.Request) (string, error) {
	sb, err := s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		return "", err
	}
	return sb.ID, nil
}

// recordSandboxID is the {id} of a by-id request if the caller may read
// that record: a sandbox it can see, or as a workspace admin, any record
// of its workspace (deleted sandboxes' too). Anything else is not found.
func (s *Server) recordSandboxID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if sb, err := s.mgr.GetSandbox(r.Context(), id); err == nil && sb.ID == id {
		return id, nil
	}
	p := caller(r)
	if p.IsAdmin() {
		ws, err := s.rec.Owner(r.Context(), id)
		if err != nil {
			return "", err
		}
		if ws != "" && ws == p.WorkspaceID {
			return id, nil
		}
	}
	return "", fmt.Errorf("audit record of sandbox %s: %w", id, errdefs.ErrNotFound)
}

func (s *Server) boxAudit(w http.ResponseWriter, r *http.Request) { s.audit(w, r, s.boxSandboxID) }
func (s *Server) idAudit(w http.ResponseWriter, r *http.Request)  { s.audit(w, r, s.recordSandboxID) }
func (s *Server) boxAuditStep(w http.ResponseWriter, r *http.Request) {
	s.auditStep(w, r, s.boxSandboxID)
}
func (s *Server) idAuditStep(w http.ResponseWriter, r *http.Request) {
	s.auditStep(w, r, s.recordSandboxID)
}

// audit serves a page of a record as JSON ({items, next_seq}) or NDJSON
// (Accept: application/x-ndjson), or with follow=true streams it over
// server-sent events from since_seq on, live.
func (s *Server) audit(w http.ResponseWriter, r *http.Request, resolve func(*http.Request) (string, error)) {
	p, err := parseAudit(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	id, err := resolve(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	p.q.SandboxID = id
	if p.follow {
		s.followAudit(w, r, p.q)
		return
	}
	evs, err := s.rec.Events(r.Context(), p.q)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if acceptsNDJSON(r) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, e := range evs {
			if enc.Encode(e) != nil {
				return
			}
		}
		return
	}
	list := protocol.AuditList{Items: evs, NextSeq: p.q.SinceSeq}
	if list.Items == nil {
		list.Items = []protocol.AuditEvent{}
	}
	if n := len(evs); n > 0 {
		list.NextSeq = evs[n-1].Seq
	}
	writeJSON(w, http.StatusOK, list)
}

func acceptsNDJSON(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

// followAudit streams q's events over SSE: first what is stored after
// q.SinceSeq, then new events as they are recorded, each as one "audit"
// event whose id is its seq (so an EventSource resumes where it left off).
// A follower that falls behind the live feed catches up from the store.
func (s *Server) followAudit(w http.ResponseWriter, r *http.Request, q store.AuditQuery) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	last := q.SinceSeq
	send := func(e protocol.AuditEvent) bool {
		b, _ := json.Marshal(e)
		last = e.Seq
		_, err := fmt.Fprintf(w, "id: %d\nevent: audit\ndata: %s\n\n", e.Seq, b)
		return err == nil
	}
	keep := time.NewTicker(followKeepAlive)
	defer keep.Stop()
	for {
		live, stop, ok := s.rec.Follow(q.SandboxID)
		if !s.catchUp(ctx, q, &last, send) || rc.Flush() != nil {
			stop()
			return
		}
		if !ok || !s.streamLive(ctx, q, live, &last, send, func() bool { return rc.Flush() == nil }, keep.C, w) {
			stop()
			return
		}
		stop()
	}
}

// catchUp sends q's stored events after *last, page by page.
func (s *Server) catchUp(ctx context.Context, q store.AuditQuery, last *int64, send func(protocol.AuditEvent) bool) bool {
	q.Limit = followPage
	for {
		q.SinceSeq = *last
		evs, err := s.rec.Events(ctx, q)
		if err != nil {
			return false
		}
		for _, e := range evs {
			if !send(e) {
				return false
			}
		}
		if len(evs) < followPage {
			return true
		}
	}
}

// streamLive sends live events matching q until the client goes (false)
// or the feed closes (true: the caller catches up and follows again,
// unless the record stopped serving follows).
func (s *Server) streamLive(ctx context.Context, q store.AuditQuery, live <-chan protocol.AuditEvent, last *int64,
	send func(protocol.AuditEvent) bool, flush func() bool, keepAlive <-chan time.Time, w http.ResponseWriter) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-keepAlive:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || !flush() {
				return false
			}
		case e, open := <-live:
			if !open {
				return s.rec.Following()
			}
			if e.Seq <= *last || !matches(q, e) {
				continue
			}
			if !send(e) || !flush() {
				return false
			}
		}
	}
}

// matches reports whether e is one q selects (its sandbox aside).
func matches(q store.AuditQuery, e protocol.AuditEvent) bool {
	return (len(q.Kinds) == 0 || slices.Contains(q.Kinds, e.Kind)) && (q.Step == 0 || q.Step == e.Step)
}

// auditStep serves one step: the command's events and captured output.
func (s *Server) auditStep(w http.ResponseWriter, r *http.Request, resolve func(*http.Request) (string, error)) {
	step, err := strconv.ParseInt(r.PathValue("step"), 10, 64)
	if err != nil || step < 1 {
		writeError(r.Context(), w, errdefs.Field("step", "must be a positive integer"))
		return
	}
	id, err := resolve(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	st, err := s.rec.Step(r.Context(), id, step)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if len(st.Events) == 0 {
		writeError(r.Context(), w, fmt.Errorf("step %d of sandbox %s: %w", step, id, errdefs.ErrNotFound))
		return
	}
	writeJSON(w, http.StatusOK, st)
}

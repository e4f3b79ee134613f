package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/health"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// gateAge is how stale a health report may be when it decides whether a
// create (or start, fork, capture) may go ahead: probes run at most once
// per gateAge however many creates arrive.
const gateAge = time.Second

// WithHealth makes /healthz report checker's checks and the store's space
// (space may be nil), and refuses requests that need the store to take new
// data with 503 while a critical check fails.
func WithHealth(checker *health.Checker, space func() (protocol.StoreSpace, error)) Option {
	return func(s *Server) { s.health, s.space = checker, space }
}

// healthz answers 200 when sandboxes can be created (ok or degraded) and
// 503 when they cannot. It needs no key: load balancers probe it.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	served := s.mgr.Runtimes()
	b := protocol.Health{OK: true, Status: health.StatusOK, Runtime: served[0].Name, Accelerator: served[0].Accelerator,
		Runtimes: served, Storage: s.mgr.StorageBackend()}
	if s.health != nil {
		rep := s.health.Run(r.Context())
		b.Status, b.Checks, b.Reasons, b.OK = rep.Status, rep.Checks, rep.Reasons(), rep.OK()
	}
	if s.space != nil {
		if sp, err := s.space(); err == nil {
			b.Space = &sp
		}
	}
	code := http.StatusOK
	if b.Status == health.StatusUnavailable {
		code = http.StatusServiceUnavailable
		setRetryAfter(w, unavailableRetry)
	}
	writeJSON(w, code, b)
}

// unavailableRetry is the Retry-After of an unavailable daemon's answers.
const unavailableRetry = 30 * time.Second

// unavailableError refuses a request while the daemon is unavailable.
type unavailableError struct{ reasons []string }

func (e *unavailableError) Error() string {
	return "the daemon cannot take new sandboxes or snapshots now: " + strings.Join(e.reasons, "; ")
}

// admitWrite refuses, with the reasons, a request that would store new data
// (create, start, fork, capture, snapshot build) while a critical check
// fails: a full or read-only store must fail the request cleanly rather
// than the sandboxes already running on it.
func (s *Server) admitWrite(ctx context.Context) error {
	if s.health == nil {
		return nil
	}
	if rep := s.health.Recent(ctx, gateAge); rep.Status == health.StatusUnavailable {
		return &unavailableError{rep.Reasons()}
	}
	return nil
}

// gated wraps a JSON handler with admitWrite.
func gated[Req, Resp any](s *Server, fn func(*http.Request, Req) (Resp, error)) func(*http.Request, Req) (Resp, error) {
	return func(r *http.Request, req Req) (Resp, error) {
		if err := s.admitWrite(r.Context()); err != nil {
			var zero Resp
			return zero, err
		}
		return fn(r, req)
	}
}

// registerDoctorRoutes adds the instance admin's view of leftovers (host
// state of ids without a sandbox record) and their cleanup.
func (s *Server) registerDoctorRoutes() {
	for _, p := range prefixes {
		s.handle("GET "+p+"/admin/leftovers", jsonHandler(http.StatusOK, nil, s.leftovers(Sandboxes.Leftovers)))
		s.handle("POST "+p+"/admin/leftovers/clean", jsonHandler(http.StatusOK, nil, s.leftovers(Sandboxes.CleanLeftovers)))
	}
}

// leftovers answers fn's leftovers to the instance admin only: they span
// every workspace.
func (s *Server) leftovers(fn func(Sandboxes, context.Context) ([]protocol.Leftover, error)) func(*http.Request, none) (protocol.Leftovers, error) {
	return func(r *http.Request, _ none) (protocol.Leftovers, error) {
		if !caller(r).InstanceAdmin {
			return protocol.Leftovers{}, fmt.Errorf("leftovers are the instance admin's: %w", errdefs.ErrForbidden)
		}
		l, err := fn(s.mgr, r.Context())
		if l == nil {
			l = []protocol.Leftover{}
		}
		return protocol.Leftovers{Leftovers: l}, err
	}
}

package api

import (
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// metrics serves the daemon's Prometheus metrics to admin keys (instance
// or workspace): they describe every workspace's sandboxes.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if _, err := admin(r, authz.ReadMetrics); err != nil && !caller(r).InstanceAdmin {
		writeError(r.Context(), w, err)
		return
	}
	s.tel.MetricsHandler().ServeHTTP(w, r)
}

// sandboxStats is GET …/boxes/{name}/stats: one sandbox's resource use.
func (s *Server) sandboxStats(r *http.Request, _ none) (*protocol.SandboxStats, error) {
	return s.mgr.Stats(r.Context(), r.PathValue("name"))
}

// listStats is GET …/stats: the resource use of every sandbox the caller
// may see.
func (s *Server) listStats(r *http.Request, _ none) (protocol.SandboxStatsList, error) {
	st, err := s.mgr.ListStats(r.Context())
	if st == nil {
		st = []protocol.SandboxStats{}
	}
	return protocol.SandboxStatsList{Sandboxes: st}, err
}

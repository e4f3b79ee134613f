package api

import (
	"context"
	"net/http"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// registerProtocolRoutes adds PATCH /boxes/{name} and the dataplane's
// glob and grep (spec B4, D7, D8).
func (s *Server) registerProtocolRoutes() {
	for _, p := range prefixes {
		s.handle("PATCH "+p+"/boxes/{name}", s.updateSandbox)
	}
	s.handle("POST /dp/{id}/glob", s.glob)
	s.handle("POST /dp/{id}/grep", s.grep)
}

// maxSearchLimit is the largest result cap a glob or grep may ask for.
const maxSearchLimit = 100000

// validateSearch checks the fields glob and grep share: an absolute path
// ("" means "/") and a limit in 0..maxSearchLimit (0 means the default).
func validateSearch(path string, limit int) error {
	if path != "" && !strings.HasPrefix(path, "/") {
		return errdefs.Field("path", "must be an absolute path")
	}
	if strings.ContainsRune(path, 0) {
		return errdefs.Field("path", "must not contain NUL")
	}
	if limit < 0 || limit > maxSearchLimit {
		return errdefs.Field("limit", "must be between 1 and %d", maxSearchLimit)
	}
	return nil
}

// glob lists entries under path matching pattern (spec D7); the agent walks
// the sandbox's own root. A missing path is a FileNotFound 404.
func (s *Server) glob(w http.ResponseWriter, r *http.Request) {
	relaySearch(s, w, r, func(req protocol.GlobRequest) error {
		return validateSearch(req.Path, req.Limit)
	}, func(ctx context.Context, c *agent.Client, req protocol.GlobRequest) (any, error) {
		return c.Glob(ctx, agent.GlobRequest{Pattern: req.Pattern, Path: req.Path, Limit: req.Limit})
	})
}

// grep finds lines containing a literal pattern under path (spec D8).
func (s *Server) grep(w http.ResponseWriter, r *http.Request) {
	relaySearch(s, w, r, func(req protocol.GrepRequest) error {
		if req.Pattern == "" {
			return errdefs.Field("pattern", "is required")
		}
		return validateSearch(req.Path, req.Limit)
	}, func(ctx context.Context, c *agent.Client, req protocol.GrepRequest) (any, error) {
		return c.Grep(ctx, agent.GrepRequest{Pattern: req.Pattern, Path: req.Path, Glob: req.Glob, Limit: req.Limit})
	})
}

// relaySearch decodes and checks a search request, then runs it in the
// sandbox's agent and writes the agent's answer (file errors mapped as for
// downloads).
func relaySearch[Req any](s *Server, w http.ResponseWriter, r *http.Request, check func(Req) error,
	run func(context.Context, *agent.Client, Req) (any, error)) {
	var req Req
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if err := check(req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	dp, ok := s.dataplane(w, r)
	if !ok {
		return
	}
	defer dp.Release()
	res, err := run(r.Context(), dp.Agent, req)
	if err != nil {
		writeAgentError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

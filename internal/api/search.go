package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// registerProtocolRoutes adds the dataplane's glob and grep (spec D7, D8).
func (s *Server) registerProtocolRoutes() {
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
// the sandbox's own root as the sandbox's run_config.user. A missing path
// is a FileNotFound 404.
func (s *Server) glob(w http.ResponseWriter, r *http.Request) {
	relaySearch(s, w, r, func(req protocol.GlobRequest) error {
		return validateSearch(req.Path, req.Limit)
	}, func(ctx context.Context, c *agent.Client, user string, req protocol.GlobRequest, each func(agent.GlobMatch) error) (bool, error) {
		return c.Glob(ctx, agent.GlobRequest{Pattern: req.Pattern, Path: req.Path, Limit: req.Limit, User: user}, each)
	})
}

// grep finds lines containing a literal pattern under path (spec D8).
func (s *Server) grep(w http.ResponseWriter, r *http.Request) {
	relaySearch(s, w, r, func(req protocol.GrepRequest) error {
		if req.Pattern == "" {
			return errdefs.Field("pattern", "is required")
		}
		return validateSearch(req.Path, req.Limit)
	}, func(ctx context.Context, c *agent.Client, user string, req protocol.GrepRequest, each func(agent.GrepMatch) error) (bool, error) {
		return c.Grep(ctx, agent.GrepRequest{Pattern: req.Pattern, Path: req.Path, Glob: req.Glob, Limit: req.Limit, User: user}, each)
	})
}

// relaySearch decodes and checks a search request, then runs it in the
// sandbox's agent and streams the matches to the client as they arrive
// (file errors mapped as for downloads). The daemon holds one match at a
// time; the agent's answer is capped (agent.MaxSearchBytes), and one cut
// short after the first match still ends as valid JSON, truncated.
func relaySearch[Req, M any](s *Server, w http.ResponseWriter, r *http.Request, check func(Req) error,
	run func(context.Context, *agent.Client, string, Req, func(M) error) (bool, error)) {
	var req Req
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if err := check(req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	dp, ok := s.dataplane(w, r, authz.SearchFiles)
	if !ok {
		return
	}
	defer dp.Release()
	out := &matchWriter{w: w}
	truncated, err := run(r.Context(), dp.Agent, dp.RunConfig.User, req, func(m M) error { return out.add(m) })
	if err != nil && !out.started {
		writeAgentError(w, r, err)
		return
	}
	out.finish(truncated || err != nil)
}

// matchWriter writes a search answer, {"matches":[...],"truncated":b}, one
// match at a time.
type matchWriter struct {
	w       http.ResponseWriter
	started bool
	err     error
}

func (m *matchWriter) start() {
	if !m.started {
		m.started = true
		m.w.Header().Set("Content-Type", "application/json")
		m.w.WriteHeader(http.StatusOK)
		_, m.err = io.WriteString(m.w, `{"matches":[`)
	}
}

// add writes one match; its error (the client went away) stops the search.
func (m *matchWriter) add(v any) error {
	sep := m.started
	m.start()
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if sep && m.err == nil {
		_, m.err = io.WriteString(m.w, ",")
	}
	if m.err == nil {
		_, m.err = m.w.Write(b)
	}
	return m.err
}

func (m *matchWriter) finish(truncated bool) {
	m.start()
	if m.err == nil {
		fmt.Fprintf(m.w, "],\"truncated\":%t}\n", truncated)
	}
}

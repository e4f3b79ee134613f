package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accesslog"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// WithAccessLog records the access audit in rec: every authenticated
// request to a route that names a sandbox, snapshot, secret, key, share,
// user, workspace or registry (collections included), and every 401 and
// 403 on any route. Without it nothing is recorded.
func WithAccessLog(rec accesslog.Recorder) Option {
	return func(s *Server) {
		if rec != nil {
			s.access = rec
		}
	}
}

// auditedKinds maps a path segment to the resource kind its wildcard
// (the next segment) names; /dp/{id} is a sandbox.
var auditedKinds = map[string]string{
	"boxes": "sandbox", "dp": "sandbox", "snapshots": "snapshot", "snapshots-by-name": "snapshot", "secrets": "secret", "keys": "key",
	"shares": "share", "users": "user", "workspaces": "workspace", "registries": "registry",
	"volumes": "volume", "volume-snapshots": "volume-snapshot",
}

// accessTarget is what a route pattern names, computed once at
// registration: the kind of its most specific audited resource, the
// wildcard holding it, and the wildcard holding the sandbox, if any.
type accessTarget struct {
	kind, wildcard, sandbox string
}

// targetOf reads pattern ("METHOD /a/{b}/c") for the access audit.
func targetOf(pattern string) accessTarget {
	_, path, _ := strings.Cut(pattern, " ")
	var t accessTarget
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i, seg := range segs {
		kind, ok := auditedKinds[seg]
		if !ok {
			continue
		}
		t.kind, t.wildcard = kind, ""
		if i+1 < len(segs) && strings.HasPrefix(segs[i+1], "{") {
			t.wildcard = strings.TrimSuffix(strings.Trim(segs[i+1], "{}"), "...")
			if kind == "sandbox" {
				t.sandbox = t.wildcard
			}
		}
	}
	return t
}

// accessNote is what an authenticated route learned of a request, for
// the record ServeHTTP writes when it ends.
type accessNote struct {
	matched   bool
	p         auth.Principal
	keyPrefix string
	route     string
	target    accessTarget
	resource  string
	sandbox   string
}

type accessNoteKey struct{}

// note fills the request's accessNote (handle calls it once the key is
// checked): who, from the principal or the rejected key, and what.
func note(r *http.Request, t accessTarget, p auth.Principal, err error) {
	n, ok := r.Context().Value(accessNoteKey{}).(*accessNote)
	if !ok {
		return
	}
	var rej *auth.RejectedError
	if errors.As(err, &rej) {
		p = rej.Principal
	}
	n.matched, n.p, n.route, n.target = true, p, r.Pattern, t
	n.keyPrefix = p.KeyPrefix
	if n.keyPrefix == "" {
		n.keyPrefix = auth.Prefix(r.Header.Get("X-Api-Key"))
	}
	if t.wildcard != "" {
		n.resource = r.PathValue(t.wildcard)
	}
	if t.sandbox != "" {
		n.sandbox = r.PathValue(t.sandbox)
	}
}

// statusWriter remembers the status a handler answered with and the body
// bytes it wrote. Unwrap keeps http.ResponseController (flush, hijack for
// WebSockets) working.
type statusWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// requestIDRE is what a client-sent X-Request-Id may be to be kept.
var requestIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// requestID returns the request's X-Request-Id if it is sane, else a new
// random one.
func requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); requestIDRE.MatchString(id) {
		return id
	}
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// audited serves r through next and records it in the access audit if it
// is one the audit keeps (see WithAccessLog). The record holds the route
// pattern and path identifiers, never the query, body or key.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if _, off := s.access.(accesslog.Discard); off {
		next.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	id := requestID(r)
	w.Header().Set("X-Request-Id", id)
	n := &accessNote{}
	sw := &statusWriter{ResponseWriter: w}
	r = r.WithContext(context.WithValue(r.Context(), accessNoteKey{}, n))
	next.ServeHTTP(sw, r)
	denied := sw.status == http.StatusUnauthorized || sw.status == http.StatusForbidden
	if !denied && (!n.matched || n.target.kind == "") {
		return
	}
	route := n.route
	if route == "" {
		route = r.Pattern
	}
	rec := store.AccessRecord{Time: start, WorkspaceID: n.p.WorkspaceID, UserID: n.p.User, KeyPrefix: n.keyPrefix,
		Method: r.Method, Route: route, ResourceKind: n.target.kind, Resource: n.resource, Sandbox: n.sandbox,
		Status: sw.status, Remote: r.RemoteAddr, RequestID: id}
	// The record's who is the request's, as noted, never filled in from
	// a context.
	s.access.Record(context.Background(), rec)
}

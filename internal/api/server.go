// Package api serves Cubicle's HTTP API: the LangSmith sandbox protocol's
// control plane (snapshots, boxes) under /v2/sandboxes and /api/v2/sandboxes,
// and each sandbox's dataplane (exec, files) under /dp/{id}.
//
// JSON handlers have one shape (jsonHandler): decode strictly (an unknown
// member is a 422 naming it), validate, call the service through the
// narrow interfaces of services.go, and encode with the shared wire types
// in sdk/go/protocol. Who may do what is internal/authz's. Errors become
// HTTP only here (errors.go).
package api

import (
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accesslog"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/gateway"
	"github.com/cubicle-dev/cubicle/internal/health"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/telemetry"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// prefixes are the control-plane mount points (spec §1.2 and §11.1).
var prefixes = []string{"/v2/sandboxes", "/api/v2/sandboxes", "/api/v1/v2/sandboxes"}

// Server is the HTTP API.
type Server struct {
	mgr       Sandboxes
	auth      Authenticator
	images    Images
	publicURL string
	log       *slog.Logger
	mux       *http.ServeMux
	// gw serves sandbox services and download links; nil without
	// WithGateway, and then their routes do not exist.
	gw Gateway
	// execOutputLimit is the bytes of each stream POST /execute keeps.
	execOutputLimit int
	// draining is closed (once, by drain) when the HTTP server shuts down.
	draining  chan struct{}
	drainOnce sync.Once
	// ident serves workspaces, users, keys and the access audit; nil
	// without WithIdentity, and then their routes do not exist.
	ident Identity
	// access records the access audit (access.go).
	access accesslog.Recorder
	// jwks is the identity-signing public key set; nil without WithJWKS,
	// and then /.well-known/jwks.json does not exist.
	jwks *jwtkeys.JWKS
	// tel instruments every route and exec (WithTelemetry; default
	// telemetry.Discard).
	tel *telemetry.Telemetry
	// limiter rate-limits requests per API key; nil without WithRateLimit.
	limiter *keyLimiter
	// rec keeps sandboxes' audit records; nil without WithRecorder, and
	// then nothing is recorded and the audit routes do not exist.
	rec *record.Recorder
	// health reports the daemon's parts and gates writes (WithHealth);
	// space measures the store for /healthz. Either may be nil.
	health *health.Checker
	space  func() (protocol.StoreSpace, error)
	// mcp serves the MCP door at /mcp; nil without WithMCP, and then the
	// route does not exist.
	mcp http.Handler
}

// drain tells long-lived responses that the server is shutting down.
func (s *Server) drain() { s.drainOnce.Do(func() { close(s.draining) }) }

// Option configures optional parts of a Server.
type Option func(*Server)

// WithGateway enables service URLs (spec §9) and download links (spec X2),
// served and minted by gw (built with WriteError as its error writer).
// A nil gw leaves them off.
func WithGateway(gw *gateway.Gateway) Option {
	return func(s *Server) {
		if gw != nil {
			s.gw = gw
		}
	}
}

// WithJWKS serves signer's public keys at GET /.well-known/jwks.json,
// unauthenticated: the clients' SandboxTokenVerifier checks the gateway's
// user tokens and the proxy's callback signatures against them.
func WithJWKS(signer *jwtkeys.Signer) Option {
	return func(s *Server) {
		if signer != nil {
			set := signer.JWKS()
			s.jwks = &set
		}
	}
}

// WithExecOutputLimit sets how many bytes of each output stream POST
// /execute keeps (default DefaultExecOutputLimit; n ≤ 0 keeps the default).
func WithExecOutputLimit(n int) Option {
	return func(s *Server) {
		if n > 0 {
			s.execOutputLimit = n
		}
	}
}

// WithTelemetry instruments the API with t (metrics, spans, request ids)
// and serves t's metrics at GET /metrics to admin keys.
func WithTelemetry(t *telemetry.Telemetry) Option {
	return func(s *Server) {
		if t != nil {
			s.tel = t
		}
	}
}

// WithRecorder records every command relayed through the dataplane in rec
// and serves the audit routes from it.
func WithRecorder(rec *record.Recorder) Option {
	return func(s *Server) { s.rec = rec }
}

// WithMCP serves h (internal/mcp's streamable-HTTP handler) at /mcp, behind
// the same authentication and rate limit as every API route; MCP hosts
// may send the key as Authorization: Bearer instead of X-Api-Key. The
// tools call this API back with the caller's key, so nothing else is
// granted here.
func WithMCP(h http.Handler) Option {
	return func(s *Server) { s.mcp = h }
}

// New returns a Server. publicURL is the externally reachable base URL from
// which dataplane URLs are derived (no trailing slash).
func New(mgr Sandboxes, a Authenticator, images Images, publicURL string, log *slog.Logger, opts ...Option) *Server {
	s := &Server{mgr: mgr, auth: a, images: images, publicURL: strings.TrimRight(publicURL, "/"), log: log, mux: http.NewServeMux(),
		execOutputLimit: DefaultExecOutputLimit, draining: make(chan struct{}), access: accesslog.Discard{}, tel: telemetry.Discard()}
	for _, opt := range opts {
		opt(s)
	}
	for _, p := range prefixes {
		s.handle("POST "+p+"/snapshots", s.postSnapshots())
		s.handle("GET "+p+"/snapshots", jsonHandler(http.StatusOK, nil, s.listSnapshots))
		s.handle("GET "+p+"/snapshots-by-name/{name}", jsonHandler(http.StatusOK, nil, s.snapshotTags))
		s.handle("GET "+p+"/snapshots/{id}", jsonHandler(http.StatusOK, nil, s.getSnapshot))
		s.handle("GET "+p+"/snapshots/{id}/build-log", s.buildLog)
		s.handle("DELETE "+p+"/snapshots/{id}", jsonHandler(http.StatusOK, nil, s.deleteSnapshot))
		s.handle("POST "+p+"/boxes", jsonHandler(http.StatusCreated, checkCreateSandbox, gated(s, s.createSandbox)))
		s.handle("GET "+p+"/boxes", jsonHandler(http.StatusOK, nil, s.listSandboxes))
		s.handle("GET "+p+"/boxes/{name}", jsonHandler(http.StatusOK, nil, s.getSandbox))
		s.handle("PATCH "+p+"/boxes/{name}", jsonHandler(http.StatusOK, nil, s.updateSandbox))
		s.handle("DELETE "+p+"/boxes/{name}", jsonHandler(http.StatusOK, nil, s.deleteSandbox))
		s.handle("GET "+p+"/boxes/{name}/status", jsonHandler(http.StatusOK, nil, s.sandboxStatus))
		s.handle("GET "+p+"/boxes/{name}/stats", jsonHandler(http.StatusOK, nil, s.sandboxStats))
		s.handle("GET "+p+"/stats", jsonHandler(http.StatusOK, nil, s.listStats))
		s.handle("POST "+p+"/boxes/{name}/stop", jsonHandler(http.StatusOK, nil, s.stopSandbox))
		s.handle("POST "+p+"/boxes/{name}/start", jsonHandler(http.StatusOK, nil, gated(s, s.startSandbox)))
		s.handle("POST "+p+"/images/load", s.loadImage)
		s.handle("GET "+p+"/images", jsonHandler(http.StatusOK, nil, s.listImages))
		s.handle("DELETE "+p+"/images/{ref...}", jsonHandler(http.StatusOK, nil, s.removeImage))
		if s.gw != nil {
			s.handle("POST "+p+"/boxes/{name}/service-url", jsonHandler(http.StatusOK, nil, s.serviceURL))
			s.handle("POST "+p+"/boxes/{name}/download-url", jsonHandler(http.StatusOK, nil, s.downloadURL))
		}
	}
	if s.gw != nil {
		// Signed links and service tokens are their own credential: no
		// X-Api-Key on these.
		s.mux.HandleFunc("GET /d/{token}", s.downloadLink)
		s.mux.HandleFunc("HEAD /d/{token}", s.downloadLink)
		s.mux.Handle("/s/", s.gw)
	}
	s.handle("POST /dp/{id}/execute", s.execute)
	s.handle("GET /dp/{id}/execute/ws", s.executeWS)
	s.handle("GET /dp/{id}/tunnel", s.openTunnel)
	s.handle("POST /dp/{id}/execute/stream/start", s.executeStreamStart)
	s.handle("POST /dp/{id}/execute/stream/resume", s.executeStreamResume)
	s.handle("POST /dp/{id}/upload", s.upload)
	s.handle("GET /dp/{id}/download", s.download)
	s.handle("HEAD /dp/{id}/download", s.download)
	s.handle("GET /metrics", s.metrics)
	if s.mcp != nil {
		s.handleKey("/mcp", mcpKey, func(w http.ResponseWriter, r *http.Request) {
			// The MCP handler takes the (authenticated) key as a bearer
			// token, whichever header carried it.
			r.Header.Set("Authorization", "Bearer "+mcpKey(r))
			s.mcp.ServeHTTP(w, r)
		})
	}
	s.registerProtocolRoutes()
	s.registerBranchingRoutes()
	s.registerTenancyRoutes()
	s.registerRecordRoutes()
	s.registerReplayRoutes()
	s.registerShareRoutes()
	s.registerDoctorRoutes()
	if s.jwks != nil {
		s.mux.HandleFunc("GET /.well-known/jwks.json", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "public, max-age=300")
			writeJSON(w, http.StatusOK, s.jwks)
		})
	}
	s.mux.HandleFunc("GET /healthz", s.healthz)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeDetail(w, http.StatusNotFound, "NotFound", "no route for "+r.Method+" "+r.URL.Path)
	})
	return s
}

// ServeHTTP implements http.Handler. A request for a host-form service
// address goes to the gateway whatever its path.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.gw != nil && s.gw.OwnsHost(r.Host) {
		s.audited(w, r, s.gw)
		return
	}
	s.audited(w, r, s.mux)
}

// handle registers an authenticated handler: every API request must carry a
// valid X-Api-Key, within its key's rate limit; the principal it names is
// put in the request context.
func (s *Server) handle(pattern string, h http.HandlerFunc) {
	s.handleKey(pattern, func(r *http.Request) string { return r.Header.Get("X-Api-Key") }, h)
}

// mcpKey is the key of an MCP request: X-Api-Key, else Authorization:
// Bearer.
func mcpKey(r *http.Request) string {
	if k := r.Header.Get("X-Api-Key"); k != "" {
		return k
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok)
	}
	return ""
}

// handleKey is handle with the key read from the request by keyOf.
func (s *Server) handleKey(pattern string, keyOf func(*http.Request) string, h http.HandlerFunc) {
	target := targetOf(pattern)
	s.mux.Handle(pattern, s.observe(pattern, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		p, err := s.auth.Authenticate(r.Context(), keyOf(r))
		note(r, target, p, err)
		if err == nil && s.limiter != nil {
			err = s.limiter.admit(p)
		}
		if err != nil {
			writeError(r.Context(), w, err)
			return
		}
		telemetry.SetWorkspace(r.Context(), p.WorkspaceID)
		h(w, withDoor(r.WithContext(auth.WithPrincipal(r.Context(), p))))
		s.log.DebugContext(r.Context(), "request", "method", r.Method, "path", r.URL.Path, "workspace", p.WorkspaceID, "took", time.Since(start))
	}))
}

// observe wraps route pattern's handler in the telemetry middleware:
// request id, span, metrics by route and status.
func (s *Server) observe(pattern string, h http.HandlerFunc) http.Handler {
	return s.tel.Middleware(pattern, h)
}

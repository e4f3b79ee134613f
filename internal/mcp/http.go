package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
)

// sessionIdle closes an HTTP session (killing its commands) after this
// long without a request.
const sessionIdle = 30 * time.Minute

// HTTPHandler serves MCP over streamable HTTP, one MCP server per session.
// It takes the caller's API key as Authorization: Bearer (401 without
// one) but does not check it: mount it behind the daemon's authenticator
// (internal/api's /mcp route, which also accepts X-Api-Key). A session's
// tools act with the key that opened it, and every later request of the
// session must carry that same key (the SDK answers 403 otherwise), so a
// session id alone grants nothing.
type HTTPHandler struct {
	h http.Handler
	// probe answers the SDK's per-request questions (its protocol
	// versions) for requests of existing sessions; it never serves one.
	probe *mcp.Server

	mu       sync.Mutex
	sessions map[*mcp.ServerSession]func()
}

// NewHTTPHandler returns the handler; newClient builds the API client of
// a key (naming the MCP door).
func NewHTTPHandler(newClient func(key string) *cubicle.Client, log *slog.Logger) *HTTPHandler {
	h := &HTTPHandler{sessions: map[*mcp.ServerSession]func(){}}
	schemas := mcp.NewSchemaCache()
	var closeProbe func()
	h.probe, closeProbe = newServer(cubicle.New("http://probe.invalid", ""), log, schemas)
	closeProbe()
	// The SDK asks for a server on every request, twice on the one that
	// opens a session; only that one gets a server of its own (memo).
	stream := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		if r.Header.Get("Mcp-Session-Id") != "" {
			return h.probe
		}
		m, _ := r.Context().Value(memoKey{}).(*serverMemo)
		if m != nil && m.srv != nil {
			return m.srv
		}
		key, _ := auth.TokenInfoFromContext(r.Context()).Extra[keyExtra].(string)
		srv, closeFn := newServer(newClient(key), log, schemas)
		// A session's commands end with it: the client's DELETE, the idle
		// timeout, or Close.
		srv.AddReceivingMiddleware(h.track(closeFn))
		if m != nil {
			m.srv = srv
		}
		return srv
	}, &mcp.StreamableHTTPOptions{
		SessionTimeout: sessionIdle,
		Logger:         log,
		// Every request carries an API key, which a page rebinding a
		// name to loopback does not have; the daemon may sit behind a
		// proxy that connects over loopback with the public Host.
		DisableLocalhostProtection: true,
	})
	// The SDK binds a session to its opener's "user": here the key itself
	// (hashed).
	h.h = auth.RequireBearerToken(func(_ context.Context, key string, _ *http.Request) (*auth.TokenInfo, error) {
		sum := sha256.Sum256([]byte(key))
		return &auth.TokenInfo{UserID: hex.EncodeToString(sum[:]), Extra: map[string]any{keyExtra: key}}, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(withMemo(stream))
	return h
}

// serverMemo holds the server made for a request that opens a session.
type serverMemo struct{ srv *mcp.Server }

type memoKey struct{}

func withMemo(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), memoKey{}, &serverMemo{})))
	})
}

// keyExtra is where the caller's key travels in the SDK's TokenInfo.
const keyExtra = "cubicle_api_key"

func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.h.ServeHTTP(w, r) }

// track returns middleware that, on a session's first request, remembers
// the session and ends its commands when it closes.
func (h *HTTPHandler) track(closeFn func()) mcp.Middleware {
	var once sync.Once
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
				once.Do(func() {
					h.mu.Lock()
					h.sessions[ss] = closeFn
					h.mu.Unlock()
					go func() {
						_ = ss.Wait()
						h.mu.Lock()
						delete(h.sessions, ss)
						h.mu.Unlock()
						closeFn()
					}()
				})
			}
			return next(ctx, method, req)
		}
	}
}

// Close ends every open session (and so their commands and streams), for
// a daemon shutting down.
func (h *HTTPHandler) Close() {
	h.mu.Lock()
	open := make([]*mcp.ServerSession, 0, len(h.sessions))
	for ss := range h.sessions {
		open = append(open, ss)
	}
	h.mu.Unlock()
	for _, ss := range open {
		_ = ss.Close()
	}
}

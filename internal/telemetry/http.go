package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/felixge/httpsnoop"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// RequestIDHeader carries a request's id, echoed on every response.
const RequestIDHeader = "X-Request-Id"

// reqInfo is what a request's logs carry. The sandbox is learnt while the
// request runs (SetSandbox), after the context is made.
type reqInfo struct {
	id      string
	sandbox atomic.Pointer[string]
}

type reqKey struct{}

func infoFrom(ctx context.Context) *reqInfo {
	ri, _ := ctx.Value(reqKey{}).(*reqInfo)
	return ri
}

// RequestID returns the id of the request ctx belongs to, or "".
func RequestID(ctx context.Context) string {
	if ri := infoFrom(ctx); ri != nil {
		return ri.id
	}
	return ""
}

// SetSandbox records that the request of ctx acts on sandbox id: its logs
// and its span carry the id from now on.
func SetSandbox(ctx context.Context, id string) {
	if ri := infoFrom(ctx); ri != nil {
		ri.sandbox.Store(&id)
	}
	trace.SpanFromContext(ctx).SetAttributes(AttrSandbox.String(id))
}

// SetWorkspace puts the workspace a request acts in on its span.
func SetWorkspace(ctx context.Context, ws string) {
	trace.SpanFromContext(ctx).SetAttributes(AttrWorkspace.String(ws))
}

// saneRequestID accepts a caller's request id of 1 to 128 characters of
// [A-Za-z0-9._:-], so it is safe in logs and headers.
func saneRequestID(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '-') {
			return false
		}
	}
	return true
}

func newRequestID() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Middleware instruments the handler of one route pattern: it gives the
// request an id (the caller's X-Request-Id if sane, else a fresh one;
// echoed on the response), a server span continuing the caller's W3C
// traceparent, and counts it by route and status code. A {id} path value
// is taken as the sandbox id (the dataplane's routes).
func (t *Telemetry) Middleware(route string, next http.Handler) http.Handler {
	traced := otelhttp.NewHandler(next, route, otelhttp.WithTracerProvider(t.tp), otelhttp.WithPropagators(t.prop),
		otelhttp.WithMeterProvider(noop.NewMeterProvider()),
		otelhttp.WithSpanNameFormatter(func(string, *http.Request) string { return route }))
	reqDuration := t.m.reqDuration.WithLabelValues(route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ri := &reqInfo{id: r.Header.Get(RequestIDHeader)}
		if !saneRequestID(ri.id) {
			ri.id = newRequestID()
		}
		if id := r.PathValue("id"); id != "" {
			ri.sandbox.Store(&id)
		}
		w.Header().Set(RequestIDHeader, ri.id)
		code := http.StatusOK
		w = httpsnoop.Wrap(w, httpsnoop.Hooks{WriteHeader: func(next httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
			return func(c int) {
				code = c
				next(c)
			}
		}})
		traced.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), reqKey{}, ri)))
		reqDuration.Observe(time.Since(start).Seconds())
		t.m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	})
}

// LogHandler wraps h so every record logged with a request's context
// carries its request_id and, once known, its sandbox (unless the record
// names one itself).
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ri := infoFrom(ctx); ri != nil {
		r.AddAttrs(slog.String("request_id", ri.id))
		if sb := ri.sandbox.Load(); sb != nil && !hasAttr(r, "sandbox") {
			r.AddAttrs(slog.String("sandbox", *sb))
		}
	}
	return l.Handler.Handle(ctx, r)
}

// hasAttr reports whether r already has a top-level attribute key.
func hasAttr(r slog.Record, key string) bool {
	found := false
	r.Attrs(func(a slog.Attr) bool {
		found = a.Key == key
		return !found
	})
	return found
}

func (l logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(as)}
}
func (l logHandler) WithGroup(name string) slog.Handler { return logHandler{l.Handler.WithGroup(name)} }

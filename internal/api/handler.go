package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
)

// noContent is the answer of an operation that returns nothing: a 204.
type noContent struct{}

// jsonHandler is the one shape of a JSON endpoint: decode the body into
// Req (unknown members, wrong types and oversize bodies refused, see
// decode), check it (check may be nil), call the service, and encode what
// it returns with status (noContent: 204, no body). Every error, from any
// step, becomes HTTP in writeError.
//
// Endpoints that stream (execute, glob, grep, files, image load, the exec
// WebSocket) keep their own writers but decode with the same decode.
func jsonHandler[Req, Resp any](status int, check func(*Req) error, call func(*http.Request, Req) (Resp, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if err := decode(r, &req); err != nil {
			writeError(r.Context(), w, err)
			return
		}
		if check != nil {
			if err := check(&req); err != nil {
				writeError(r.Context(), w, err)
				return
			}
		}
		resp, err := call(r, req)
		if err != nil {
			writeError(r.Context(), w, err)
			return
		}
		if _, ok := any(resp).(noContent); ok {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		writeJSON(w, status, resp)
	}
}

// none is the request of an endpoint that takes no body members.
type none struct{}

// caller returns the principal the request acts as (handle put it there).
func caller(r *http.Request) auth.Principal {
	p, _ := auth.FromContext(r.Context())
	return p
}

// admin returns the caller if it may perform the admin-only op.
func admin(r *http.Request, op authz.Admin) (auth.Principal, error) {
	p := caller(r)
	return p, authz.Require(p, op)
}

// cancelOn returns a child of ctx that is also cancelled when done closes
// (the sandbox instance went away, the server is draining).
func cancelOn(ctx context.Context, done <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

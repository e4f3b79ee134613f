package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeDetail writes the protocol's structured error body (spec §2 form 1).
func writeDetail(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, protocol.ErrorBody{Detail: protocol.ErrorDetail{Error: typ, Message: msg}})
}

// Pydantic's error types for a 422 item.
const (
	valueError     = "value_error"
	extraForbidden = "extra_forbidden"
)

// writeValidation writes a 422 in the Pydantic array form (spec §2 form 2).
func writeValidation(w http.ResponseWriter, field, msg string) {
	writeValidationItem(w, field, msg, valueError)
}

func writeValidationItem(w http.ResponseWriter, field, msg, typ string) {
	loc := []string{"body"}
	if field != "" {
		loc = append(loc, field)
	}
	writeJSON(w, http.StatusUnprocessableEntity, protocol.ValidationBody{Detail: []protocol.ValidationItem{{Loc: loc, Msg: msg, Type: typ}}})
}

// setRetryAfter sets Retry-After to d in whole seconds, rounded up, at
// least 1.
func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	secs := int64((d + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
}

// writeError maps an internal error kind to its status and body. This is the
// only place error kinds become HTTP.
func writeError(ctx context.Context, w http.ResponseWriter, err error) {
	var fe *errdefs.FieldError
	var be *sandbox.BootError
	var ue *unknownFieldError
	var le *errdefs.LimitError
	var ua *unavailableError
	var pe *errdefs.PendingError
	var ce *errdefs.CapacityError
	switch {
	case errors.As(err, &ua):
		setRetryAfter(w, unavailableRetry)
		writeDetail(w, http.StatusServiceUnavailable, "ServiceUnavailable", ua.Error())
	case errors.As(err, &ce):
		setRetryAfter(w, ce.RetryAfter)
		writeDetail(w, http.StatusServiceUnavailable, "HostAtCapacity", ce.Error())
	case errors.As(err, &pe):
		setRetryAfter(w, pe.RetryAfter)
		writeDetail(w, http.StatusServiceUnavailable, "NotReady", pe.Error())
	case errors.As(err, &le):
		setRetryAfter(w, le.RetryAfter)
		typ := "QuotaExceeded"
		if le.Kind == errdefs.RateLimit {
			typ = "RateLimited"
		}
		writeDetail(w, http.StatusTooManyRequests, typ, le.Error())
	case errors.As(err, &fe):
		writeValidation(w, fe.Field, fe.Msg)
	case errors.As(err, &ue):
		writeValidationItem(w, ue.path, "Extra inputs are not permitted: this server does not know the field", extraForbidden)
	case errors.Is(err, sandbox.ErrInvalidRequest):
		writeDetail(w, http.StatusBadRequest, "InvalidRequest", err.Error())
	case errors.Is(err, errdefs.ErrInvalid):
		writeValidation(w, "", err.Error())
	case errors.Is(err, errdefs.ErrNotFound):
		writeDetail(w, http.StatusNotFound, "NotFound", err.Error())
	case errors.Is(err, errdefs.ErrConflict):
		writeDetail(w, http.StatusConflict, "Conflict", err.Error())
	case errors.Is(err, errdefs.ErrNotReady):
		writeDetail(w, http.StatusBadRequest, "NotReady", err.Error())
	case errors.Is(err, errdefs.ErrTimeout):
		writeDetail(w, http.StatusRequestTimeout, "Timeout", err.Error())
	case errors.Is(err, errdefs.ErrUnauthorized):
		writeDetail(w, http.StatusUnauthorized, "Unauthorized", err.Error())
	case errors.Is(err, errdefs.ErrForbidden):
		writeDetail(w, http.StatusForbidden, "Forbidden", err.Error())
	case errors.Is(err, errdefs.ErrTooLarge):
		writeDetail(w, http.StatusRequestEntityTooLarge, "TooLarge", err.Error())
	case errors.Is(err, errdefs.ErrUnavailable):
		writeDetail(w, http.StatusBadGateway, "ConnectionError", err.Error())
	case errors.As(err, &be):
		writeDetail(w, http.StatusUnprocessableEntity, "CrashLoop", err.Error())
	case errors.Is(err, context.Canceled):
		writeDetail(w, 499, "Canceled", err.Error())
	default:
		slog.ErrorContext(ctx, "internal error", "err", err)
		writeDetail(w, http.StatusInternalServerError, "InternalError", err.Error())
	}
}

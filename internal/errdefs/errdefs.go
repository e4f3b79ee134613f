// Package errdefs defines the error kinds that cross package boundaries.
//
// Internal packages wrap one of these sentinels with context
// (fmt.Errorf("stat %s: %w", p, errdefs.ErrNotFound)); only internal/api
// translates a kind into an HTTP status and the protocol's error body.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel kinds. Test with errors.Is.
var (
	ErrNotFound     = errors.New("not found")
	ErrConflict     = errors.New("conflict")
	ErrInvalid      = errors.New("invalid argument")
	ErrNotReady     = errors.New("not ready")
	ErrUnavailable  = errors.New("unavailable")
	ErrUnauthorized = errors.New("unauthorized")
	ErrForbidden    = errors.New("forbidden")
	ErrTimeout      = errors.New("timeout")
	ErrTooLarge     = errors.New("too large")
)

// IsNotFound reports whether err is of kind ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// FieldError is an invalid request field; the API reports it in the
// protocol's 422 form with Field as the location.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Unwrap makes a FieldError an ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Field returns a FieldError for field.
func Field(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Limit kinds of a LimitError. The official clients read the kind of a
// quota from the 429's message (spec §7.1): it must contain "sandbox
// count", "cpu", "memory" or "storage"; LimitError's Error leads with the
// kind's wording so it always does.
const (
	QuotaSandboxes = "sandbox count"
	QuotaCPU       = "cpu"
	QuotaMemory    = "memory"
	QuotaStorage   = "storage"
	QuotaSnapshots = "snapshot count"
	// RateLimit is a per-key request rate limit, not a quota.
	RateLimit = "request rate"
)

// LimitError is a refused request that would exceed a workspace quota or
// a key's rate limit; the API answers 429 with Retry-After.
type LimitError struct {
	// Kind is one of the Quota* constants or RateLimit.
	Kind string
	// Msg says what was asked and what the limit is.
	Msg string
	// RetryAfter is when trying again may succeed (rounded up to whole
	// seconds on the wire, at least 1).
	RetryAfter time.Duration
}

func (e *LimitError) Error() string { return e.Kind + " limit exceeded: " + e.Msg }

// PendingError is a request that needs something still being made (a
// built-in snapshot building); the API answers 503 NotReady with
// Retry-After. It is an ErrNotReady.
type PendingError struct {
	Msg string
	// RetryAfter is when trying again may succeed (rounded up to whole
	// seconds on the wire, at least 1).
	RetryAfter time.Duration
}

func (e *PendingError) Error() string { return e.Msg }

// Unwrap makes a PendingError an ErrNotReady.
func (e *PendingError) Unwrap() error { return ErrNotReady }

// CapacityError is a request the host cannot take now — every boot slot
// and queue place is taken, or the host lacks the memory or store space
// for it — though it may later; the API answers 503 HostAtCapacity with
// Retry-After. It is an ErrUnavailable.
type CapacityError struct {
	Msg string
	// RetryAfter is when trying again may succeed (rounded up to whole
	// seconds on the wire, at least 1).
	RetryAfter time.Duration
}

func (e *CapacityError) Error() string { return "host at capacity: " + e.Msg }

// Unwrap makes a CapacityError an ErrUnavailable.
func (e *CapacityError) Unwrap() error { return ErrUnavailable }

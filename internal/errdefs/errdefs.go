// Package errdefs defines the error kinds that cross package boundaries.
//
// Internal packages wrap one of these sentinels with context
// (fmt.Errorf("stat %s: %w", p, errdefs.ErrNotFound)); only internal/api
// translates a kind into an HTTP status and the protocol's error body.
package errdefs

import (
	"errors"
	"fmt"
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

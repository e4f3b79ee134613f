package cubicle

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Sentinel errors. Test with errors.Is; they are always wrapped with context.
var (
	// ErrCommandTimeout reports that a command ran past its timeout and was
	// killed by the server (exec error type CommandTimeout).
	ErrCommandTimeout = errors.New("command timed out")
	// ErrSnapshotFailed reports that a snapshot build ended in status
	// "failed"; the wrapping error carries the server's status_message.
	ErrSnapshotFailed = errors.New("snapshot build failed")
	// ErrSandboxFailed reports that a sandbox ended in status "failed".
	ErrSandboxFailed = errors.New("sandbox failed")
	// ErrNoDataplane reports a sandbox without a dataplane_url, so no
	// runtime call can reach it.
	ErrNoDataplane = errors.New("sandbox has no dataplane URL")
)

// APIError is a non-2xx answer from the daemon, decoded from any of the
// protocol's three error bodies (spec §2).
type APIError struct {
	// Status is the HTTP status code.
	Status int
	// Type is detail.error (e.g. "NotFound", "ImagePull", "CommandTimeout");
	// "ValidationError" for a 422 Pydantic array; empty for plain bodies.
	Type string
	// Message is detail.message, the joined msg values of a 422 array, a
	// plain detail string, or "HTTP <status>: <text>" for a non-JSON body.
	Message string
	// Field is the last loc element of the first 422 array item, if any.
	Field string
}

func (e *APIError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cubicle API: %d", e.Status)
	if e.Type != "" {
		b.WriteString(" " + e.Type)
	}
	if e.Field != "" {
		b.WriteString(" (" + e.Field + ")")
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// Is lets errors.Is(err, ErrCommandTimeout) hold for an HTTP exec that the
// server reported as a timeout.
func (e *APIError) Is(target error) bool {
	return target == ErrCommandTimeout && e.Type == protocol.ErrCommandTimeout
}

// IsNotFound reports whether err is an API answer meaning the resource (a
// sandbox, snapshot or file) does not exist.
func IsNotFound(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	return ae.Status == http.StatusNotFound || ae.Type == "FileNotFound"
}

// IsConflict reports whether err is a 409, e.g. a sandbox or snapshot name
// already taken.
func IsConflict(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == http.StatusConflict
}

// ExecError is an error frame from the exec WebSocket (spec §6.3) other than
// a timeout, e.g. CommandNotFound or SessionExpired on a reconnect.
type ExecError struct {
	Type    string // error_type; "CommandError" when the server sent none
	Message string
}

func (e *ExecError) Error() string { return "exec " + e.Type + ": " + e.Message }

// Is makes errors.Is(err, ErrCommandTimeout) hold for timeout frames.
func (e *ExecError) Is(target error) bool {
	return target == ErrCommandTimeout && e.Type == protocol.ErrCommandTimeout
}

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// checkResponse returns nil for a 2xx response and an *APIError otherwise.
// It does not close the body.
func checkResponse(resp *http.Response) error {
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	return parseError(resp.StatusCode, body)
}

// parseError decodes an error body, trying the structured, Pydantic and
// plain forms in the order the official client does.
func parseError(status int, body []byte) *APIError {
	ae := &APIError{Status: status}
	var env struct {
		Detail json.RawMessage `json:"detail"`
	}
	if json.Unmarshal(body, &env) != nil || len(env.Detail) == 0 {
		ae.Message = fmt.Sprintf("HTTP %d: %s", status, http.StatusText(status))
		return ae
	}
	var structured struct {
		Error   string `json:"error"`
		Message string `json:"message"`
		ErrorID string `json:"error_id"`
	}
	// Not protocol.ValidationItem: Pydantic locs may hold list indexes.
	var items []struct {
		Loc []any  `json:"loc"`
		Msg string `json:"msg"`
	}
	var plain string
	switch {
	case json.Unmarshal(env.Detail, &structured) == nil:
		ae.Type, ae.Message = structured.Error, structured.Message
		if structured.ErrorID != "" {
			ae.Message += " (error_id=" + structured.ErrorID + ")"
		}
	case json.Unmarshal(env.Detail, &items) == nil:
		ae.Type = "ValidationError"
		msgs := make([]string, 0, len(items))
		for _, it := range items {
			msgs = append(msgs, it.Msg)
		}
		ae.Message = strings.Join(msgs, "; ")
		if len(items) > 0 && len(items[0].Loc) > 0 {
			ae.Field = fmt.Sprint(items[0].Loc[len(items[0].Loc)-1])
		}
	case json.Unmarshal(env.Detail, &plain) == nil:
		ae.Message = plain
	default:
		ae.Message = string(env.Detail)
	}
	return ae
}

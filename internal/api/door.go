package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// A door is the protocol a request came in through: the LangSmith API
// (the default), or a front door that translates another protocol (MCP,
// E2B) into calls on this API. Doors call the API like any client, with
// the caller's own key, so authorization, limits and the record are the
// same behind each; they name themselves in DoorHeader so the record says
// which door a command or file came through. The header is the caller's
// own statement (the key, not the door, carries authority), so only known
// door names are recorded and anything else reads as the default.
const DoorHeader = protocol.DoorHeader

// Door names.
const (
	DoorLangSmith = protocol.DoorLangSmith
	DoorMCP       = protocol.DoorMCP
	DoorE2B       = protocol.DoorE2B
)

type doorKey struct{}

// withDoor puts r's door into its context.
func withDoor(r *http.Request) *http.Request {
	switch d := r.Header.Get(DoorHeader); d {
	case DoorMCP, DoorE2B:
		return r.WithContext(context.WithValue(r.Context(), doorKey{}, d))
	}
	return r
}

// doorOf returns the door ctx's request came through.
func doorOf(ctx context.Context) string {
	if d, ok := ctx.Value(doorKey{}).(string); ok {
		return d
	}
	return DoorLangSmith
}

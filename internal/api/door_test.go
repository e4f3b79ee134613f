package api

import (
	"net/http/httptest"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestDoor: a known door name in DoorHeader reaches the command record;
// an unknown one, or none, records the LangSmith door.
func TestDoor(t *testing.T) {
	for hdr, want := range map[string]string{"mcp": DoorMCP, "e2b": DoorE2B, "": DoorLangSmith, "evil": DoorLangSmith, "MCP": DoorLangSmith} {
		r := httptest.NewRequest("POST", "/execute", nil)
		if hdr != "" {
			r.Header.Set(DoorHeader, hdr)
		}
		r = withDoor(r)
		cs := commandStart(r.Context(), "s", &sandbox.Conn{WorkspaceID: "w"}, &protocol.ExecFrame{Command: "true"}, nil, "http")
		if cs.Door != want {
			t.Errorf("header %q: door %q, want %q", hdr, cs.Door, want)
		}
	}
}

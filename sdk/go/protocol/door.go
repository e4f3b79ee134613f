package protocol

// DoorHeader names the front door a request came through: a client that
// translates another protocol into calls on this API (the MCP server, the
// E2B-compatible API) sends it with the caller's own key, and the daemon
// records the door with each command and file transfer. It carries no
// authority: the key does.
const DoorHeader = "X-Cubicle-Door"

// Door names. A request without DoorHeader (or with an unknown name) came
// through the LangSmith door.
const (
	DoorLangSmith = "langsmith"
	DoorMCP       = "mcp"
	DoorE2B       = "e2b"
)

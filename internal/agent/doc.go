// Package agent is the in-sandbox agent (`cubicle agent`, PID 1 in every
// sandbox) and the daemon's client for it.
//
// The agent reaps zombies, runs commands and serves files. The daemon reaches
// it over the sandbox's own network address on Port, authenticating every
// request with the per-sandbox token in TokenHeader. Exec speaks the LangSmith
// WebSocket exec protocol (sdk/go/protocol.ExecFrame), so the daemon can relay
// a client's exec stream frame by frame and command sessions live in the
// sandbox, surviving a daemon restart.
package agent

// Port is the TCP port the agent listens on inside every sandbox.
const Port = 49983

// TokenEnv is the environment variable that hands PID 1 its token. The agent
// removes it from the environment of every command it runs.
const TokenEnv = "CUBICLE_AGENT_TOKEN"

// TokenHeader carries the per-sandbox token on every daemon→agent request,
// as "Bearer <token>".
const TokenHeader = "Authorization"

// Package agent is the in-sandbox agent (`cubicle agent`, PID 1 in every
// sandbox) and the daemon's client for it.
//
// The agent reaps zombies, runs commands and serves files. The daemon reaches
// it over the sandbox's own network address on Port, authenticating every
// request with the per-sandbox token in TokenHeader. Exec speaks the LangSmith
// WebSocket exec protocol (sdk/go/protocol.ExecFrame), so the daemon can relay
// a client's exec stream frame by frame and command sessions live in the
// sandbox, surviving a daemon restart.
//
// The agent's HTTP API (every request needs TokenHeader):
//
//	GET  /v1/health                 {"ok":true,"protocol":ProtocolVersion}
//	POST /v1/token                  {"token"}: replace the token (204); see token.go
//	GET  /v1/memguard               MemGuardStats: the OOM guard's state and kills
//	GET  /v1/exec                   WebSocket, spec §6 frames (plus "resize")
//	GET  /v1/files?path=            file bytes; Range, If-Range, If-None-Match
//	HEAD /v1/files?path=            size, strong ETag, Last-Modified
//	PUT  /v1/files?path=&mode=0644  raw body, atomic replace, parents created
//	GET  /v1/stat?path=             FileInfo
//	POST /v1/glob                   GlobRequest → GlobResult (spec D7)
//	POST /v1/grep                   GrepRequest → GrepResult (spec D8)
//
// File calls take the user to act as (?user=, or "user" in a search body:
// the sandbox's run_config.user) and run with that user's credentials and
// a symlink rule (see asUser); only regular files on disk are served.
// Search answers are capped at MaxSearchBytes, exec frames the daemon
// reads at MaxAgentFrame: the daemon bounds what it reads from an agent
// whatever the agent sends.
//
// With MemLimitEnv set (the gvisor driver sets it from the sandbox's memory
// limit) the agent also runs an OOM guard: gVisor has no OOM killer, so the
// agent kills the biggest process when the sandbox's memory nears the limit,
// before the host cgroup would kill the whole sandbox (see memGuard).
//
// Errors use the protocol's {"detail":{"error","message"}} body, so the
// daemon can relay them unchanged.
//
// Every command is a session keyed by its command_id: output is kept in a
// bounded per-stream window addressed by byte offset, so any number of
// clients can attach, detach and resume from an offset until the finished
// session's TTL expires. Commands are started with raw fork/exec and their
// exit statuses collected by a single reaper (see reaper), which is what lets
// the agent reap every orphan as PID 1 without stealing statuses.
package agent

// Port is the TCP port the agent listens on inside every sandbox.
const Port = 49983

// TokenHeader carries the per-sandbox token on every daemon→agent request,
// as "Bearer <token>".
const TokenHeader = "Authorization"

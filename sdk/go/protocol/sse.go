package protocol

// SSE exec (spec additions): POST <dataplane>/execute/stream/start runs a
// command and streams its output as Server-Sent Events; POST
// <dataplane>/execute/stream/resume continues one from byte offsets, which
// also acknowledge what the client has received.

// ExecStreamStartRequest is the body of /execute/stream/start: the execute
// frame's fields a one-way transport can honour (no PTY, no stdin after
// spawn, no kill, no kill_on_disconnect).
type ExecStreamStartRequest struct {
	Command            string            `json:"command"`
	CommandID          string            `json:"command_id,omitempty"`
	Shell              string            `json:"shell,omitempty"`
	TimeoutSeconds     *int64            `json:"timeout_seconds,omitempty"`
	IdleTimeoutSeconds *int64            `json:"idle_timeout_seconds,omitempty"`
	TTLSeconds         *int64            `json:"ttl_seconds,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	Cwd                string            `json:"cwd,omitempty"`
	RunConfig          *RunConfig        `json:"run_config,omitempty"`
}

// ExecStreamResumeRequest is the body of /execute/stream/resume.
type ExecStreamResumeRequest struct {
	CommandID    string `json:"command_id"`
	StdoutOffset int64  `json:"stdout_offset"`
	StderrOffset int64  `json:"stderr_offset"`
}

// SSE exec event names.
const (
	SSEStarted     = "started"
	SSEStdout      = "stdout"
	SSEStderr      = "stderr"
	SSEStreamEnd   = "stream_end"
	SSEExit        = "exit"
	SSEAckRequired = "ack_required"
	SSEError       = "error"
)

// ErrServerShuttingDown is the error_type of an SSE error event the client
// should resume after.
const ErrServerShuttingDown = "ServerShuttingDown"

// StreamChunk is the data of a stdout or stderr event: Data is the base64
// of the bytes at Offset.
type StreamChunk struct {
	Offset int64  `json:"offset"`
	Data   string `json:"data"`
}

// StreamEnd is the data of a stream_end event.
type StreamEnd struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
}

// AckRequired is the data of an ack_required event: resume from these.
type AckRequired struct {
	StdoutOffset int64 `json:"stdout_offset"`
	StderrOffset int64 `json:"stderr_offset"`
}

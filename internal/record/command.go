package record

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Output stream names.
const (
	streamStdout = "stdout"
	streamStderr = "stderr"
)

// Kill reasons carried by command.killed.
const (
	KillRequested = "kill"    // the client sent a kill frame
	KillTimeout   = "timeout" // timeout_seconds passed
)

// CommandStart describes a command as the daemon sent it to the agent.
// Env holds only variable names: values (secrets) are never recorded.
type CommandStart struct {
	SandboxID   string
	WorkspaceID string
	CommandID   string
	Command     string
	Shell       string
	User        string
	Cwd         string
	EnvKeys     []string
	// TimeoutSeconds is the command's timeout (0: the agent's default).
	TimeoutSeconds int64
	PTY            bool
	// Via is the dataplane route: "ws", "http" or "sse".
	Via string
	// Door is the protocol the caller came through: "langsmith", "mcp"
	// or "e2b" (see api.DoorHeader).
	Door string
}

// EnvKeys returns env's names, sorted.
func EnvKeys(env map[string]string) []string {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

type cmdKey struct{ sandbox, command string }

// maxOpenCommands bounds the commands the Recorder follows at once (each
// holds up to OutputCap of output per stream): past it, the oldest is
// ended as lost. Commands end when they exit, when a reconnect finds them
// gone, or when their sandbox stops; detached ones nobody reconnects to
// would otherwise stay open while their sandbox runs.
const maxOpenCommands = 1024

// Command is one command's open step: it counts and captures its output
// and records its reconnects, kill and exit as events of the step. Safe
// for concurrent use; only the first exit counts.
type Command struct {
	r     *Recorder
	key   cmdKey
	ws    string
	step  int64
	start time.Time

	mu             sync.Mutex
	stdout, stderr *capture
	killed         string
	ended          bool
}

type startedData struct {
	CommandID      string   `json:"command_id"`
	Command        string   `json:"command"`
	Shell          string   `json:"shell,omitempty"`
	User           string   `json:"user,omitempty"`
	Cwd            string   `json:"cwd,omitempty"`
	EnvKeys        []string `json:"env_keys,omitempty"`
	TimeoutSeconds int64    `json:"timeout_seconds,omitempty"`
	PTY            bool     `json:"pty,omitempty"`
	Via            string   `json:"via"`
	Door           string   `json:"door,omitempty"`
}

// StartCommand records command.started and opens the command's step,
// whose id is that event's seq.
func (r *Recorder) StartCommand(ctx context.Context, s CommandStart) *Command {
	c := &Command{r: r, key: cmdKey{s.SandboxID, s.CommandID}, ws: s.WorkspaceID, start: time.Now(),
		stdout: newCapture(r.opt.OutputCap), stderr: newCapture(r.opt.OutputCap)}
	c.step = r.record(ctx, Event{SandboxID: s.SandboxID, WorkspaceID: s.WorkspaceID, Kind: protocol.KindCommand,
		Type: protocol.EventCommandStarted, Data: startedData{CommandID: s.CommandID, Command: s.Command, Shell: s.Shell,
			User: s.User, Cwd: s.Cwd, EnvKeys: s.EnvKeys, TimeoutSeconds: s.TimeoutSeconds, PTY: s.PTY, Via: s.Via, Door: s.Door}})
	r.runStart(c)
	r.mu.Lock()
	var evict *Command
	if s.CommandID != "" {
		if len(r.cmds) >= maxOpenCommands {
			for _, o := range r.cmds {
				if evict == nil || o.start.Before(evict.start) {
					evict = o
				}
			}
		}
		r.cmds[c.key] = c
	}
	r.mu.Unlock()
	if evict != nil {
		evict.Lost(ctx, "too many open commands: no longer followed")
	}
	return c
}

// BeforeCommand is called before a command is sent to sandboxID's agent:
// the file watcher indexes the sandbox's files if it has not yet and lets
// its earlier scans finish (bounded), so what the command writes counts
// as its own.
func (r *Recorder) BeforeCommand(ctx context.Context, sandboxID string) {
	if w := r.fileWatcher(); w != nil {
		w.CommandStarting(ctx, sandboxID)
	}
}

// OpenCommand returns sandboxID's open command commandID, or nil.
func (r *Recorder) OpenCommand(sandboxID, commandID string) *Command {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmds[cmdKey{sandboxID, commandID}]
}

// Step is the command's step id.
func (c *Command) Step() int64 { return c.step }

// Output adds p to the command's stdout or stderr; off is p's offset in
// its stream, or -1 when the stream is delivered once, in order.
func (c *Command) Output(stream string, off int64, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return
	}
	cp := c.stream(stream)
	if off < 0 {
		cp.settle() // appends after everything held
		cp.writeAt(cp.total, p)
		return
	}
	cp.add(chunk{off: off, data: p})
}

// OutputLiteral is Output of a JSON string literal, as an exec frame
// carries it, decoded only if it is kept (chunks.go): the literal is the
// text, or with b64 the base64 of the bytes (a binary-safe connection).
// lit must not change afterwards.
func (c *Command) OutputLiteral(stream string, off int64, lit []byte, b64 bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ended {
		c.stream(stream).add(chunk{off: off, lit: lit, b64: b64})
	}
}

func (c *Command) stream(name string) *capture {
	if name == streamStderr {
		return c.stderr
	}
	return c.stdout
}

// Stdout and Stderr are the stream names Output takes.
const (
	Stdout = streamStdout
	Stderr = streamStderr
)

// event records an event of the command's step.
func (c *Command) event(ctx context.Context, typ string, data any) {
	c.r.record(ctx, Event{SandboxID: c.key.sandbox, WorkspaceID: c.ws, Kind: protocol.KindCommand, Type: typ, Step: c.step, Data: data})
}

// Reconnected records that a client attached to the running command again.
func (c *Command) Reconnected(ctx context.Context) {
	c.event(ctx, protocol.EventCommandReconnected, nil)
}

// Killed records that the command is being killed, and why (KillRequested,
// KillTimeout). Only the first kill is recorded.
func (c *Command) Killed(ctx context.Context, reason string) {
	c.mu.Lock()
	first := c.killed == "" && !c.ended
	if first {
		c.killed = reason
	}
	c.mu.Unlock()
	if first {
		c.event(ctx, protocol.EventCommandKilled, map[string]string{"reason": reason})
	}
}

type exitedData struct {
	ExitCode    *int   `json:"exit_code"`
	DurationMS  int64  `json:"duration_ms"`
	StdoutBytes int64  `json:"stdout_bytes"`
	StderrBytes int64  `json:"stderr_bytes"`
	Killed      string `json:"killed,omitempty"`
	// Error is the agent's or the connection's error when the command
	// ended without an exit code (CommandTimeout, CommandError, ...).
	Error string `json:"error,omitempty"`
	// Lost says why the exit was not seen (the sandbox stopped).
	Lost string `json:"lost,omitempty"`
}

// Exited records the command's end with its exit code, or with errType
// when it has none (killed at its timeout, refused by the agent), and
// stores its output. Later calls do nothing.
func (c *Command) Exited(ctx context.Context, code *int, errType string) {
	c.end(ctx, code, errType, "")
}

// Lost ends the command without an exit the daemon saw: why says what
// happened to it (its session expired, the agent no longer knows it).
func (c *Command) Lost(ctx context.Context, why string) { c.end(ctx, nil, "", why) }

func (c *Command) end(ctx context.Context, code *int, errType, lost string) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	c.stdout.settle()
	c.stderr.settle()
	d := exitedData{ExitCode: code, DurationMS: time.Since(c.start).Milliseconds(), StdoutBytes: c.stdout.total,
		StderrBytes: c.stderr.total, Killed: c.killed, Error: errType, Lost: lost}
	outs := []*capture{c.stdout, c.stderr}
	c.mu.Unlock()
	c.r.mu.Lock()
	if c.r.cmds[c.key] == c {
		delete(c.r.cmds, c.key)
	}
	c.r.mu.Unlock()
	c.r.runEnd(c)
	c.event(ctx, protocol.EventCommandExited, d)
	if c.step == 0 {
		return // its start was dropped: nothing to attach output to
	}
	if w := c.r.fileWatcher(); w != nil {
		w.CommandEnded(ctx, c.key.sandbox, c.ws, c.step)
	}
	for i, name := range []string{streamStdout, streamStderr} {
		if outs[i].total > 0 {
			c.r.saveOutput(outs[i].output(c.key.sandbox, c.step, name))
		}
	}
}

// endCommands ends sandboxID's open commands, whose exit the daemon will
// not see: the instance running them is going (why: stopped or deleted).
func (r *Recorder) endCommands(ctx context.Context, sandboxID, why string) {
	r.mu.Lock()
	var open []*Command
	for k, c := range r.cmds {
		if k.sandbox == sandboxID {
			open = append(open, c)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(open, func(a, b *Command) int { return int(a.step - b.step) })
	for _, c := range open {
		c.end(ctx, nil, "", "sandbox "+why)
	}
}

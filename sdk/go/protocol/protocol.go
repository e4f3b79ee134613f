// Package protocol holds the wire types of the LangSmith sandbox protocol as
// Cubicle speaks it (see shared/spec/langsmith-sandbox-protocol.md). The API
// handlers, the in-sandbox agent, the Go SDK and the tests all use these
// types, so there is exactly one definition of the contract.
package protocol

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
)

// Sandbox statuses (spec §8). A sandbox moves provisioning → ready ⇄ stopped,
// or provisioning → failed.
const (
	StatusProvisioning = "provisioning"
	StatusReady        = "ready"
	StatusStopped      = "stopped"
	StatusFailed       = "failed"
	StatusDeleting     = "deleting"
)

// Snapshot statuses (spec §8): building → ready | failed.
const (
	SnapshotBuilding = "building"
	SnapshotReady    = "ready"
	SnapshotFailed   = "failed"
)

// RunConfig is how commands run: user, working directory and environment
// (spec §4.3). Layers apply image → snapshot → sandbox → command.
type RunConfig struct {
	User    string            `json:"user,omitempty"`
	WorkDir string            `json:"work_dir,omitempty"`
	EnvVars map[string]string `json:"env_vars,omitempty"`
}

// Layer returns rc with over applied on top: user and work_dir replace when
// set, env_vars merge key by key.
func (rc RunConfig) Layer(over *RunConfig) RunConfig {
	out := RunConfig{User: rc.User, WorkDir: rc.WorkDir}
	if len(rc.EnvVars) > 0 || (over != nil && len(over.EnvVars) > 0) {
		out.EnvVars = map[string]string{}
	}
	for k, v := range rc.EnvVars {
		out.EnvVars[k] = v
	}
	if over == nil {
		return out
	}
	if over.User != "" {
		out.User = over.User
	}
	if over.WorkDir != "" {
		out.WorkDir = over.WorkDir
	}
	for k, v := range over.EnvVars {
		out.EnvVars[k] = v
	}
	return out
}

// Snapshot is a bootable root filesystem (spec §4.2).
type Snapshot struct {
	ID              string     `json:"id"`
	Name            string     `json:"name"`
	Status          string     `json:"status"`
	StatusMessage   string     `json:"status_message,omitempty"`
	FSCapacityBytes int64      `json:"fs_capacity_bytes"`
	FSUsedBytes     *int64     `json:"fs_used_bytes,omitempty"`
	DockerImage     string     `json:"docker_image,omitempty"`
	ImageDigest     string     `json:"image_digest,omitempty"`
	SourceSandboxID string     `json:"source_sandbox_id,omitempty"`
	RegistryID      string     `json:"registry_id,omitempty"`
	CreatedBy       string     `json:"created_by,omitempty"`
	RunConfig       *RunConfig `json:"run_config,omitempty"`
	CreatedAt       time.Time  `json:"created_at"`
	UpdatedAt       time.Time  `json:"updated_at"`

	// PullBytesTotal and PullBytesDone are a Cubicle extension reported while
	// a snapshot is building from a registry image: the compressed bytes of
	// the image's layers and how many of them have arrived. Total is 0 while
	// unknown. Both are omitted once the build is over.
	PullBytesTotal int64 `json:"pull_bytes_total,omitempty"`
	PullBytesDone  int64 `json:"pull_bytes_done,omitempty"`

	// BuildStep and BuildPercent are a Cubicle extension reported while a
	// built-in snapshot (the default computer) is building: what the
	// build is doing and an estimate of how much of it is done (0–100).
	// Both are omitted once the build is over.
	BuildStep    string `json:"build_step,omitempty"`
	BuildPercent int    `json:"build_percent,omitempty"`
	// Builtin marks a snapshot of the server's own (the default
	// computer): every workspace can boot it, none can delete or change
	// it, and a workspace's own snapshot of the same name overrides it.
	Builtin bool `json:"builtin,omitempty"`
	// Packages maps each package a built-in snapshot's blueprint
	// installed to its version (GET of one snapshot only).
	Packages map[string]string `json:"packages,omitempty"`

	// Tag is the snapshot's Docker-style tag under its name ("" when a
	// newer snapshot of the name took it); name:tag addresses it.
	Tag string `json:"tag,omitempty"`
	// Labels are key/value metadata; sandboxes created from the snapshot
	// inherit them.
	Labels map[string]string `json:"labels"`
	// StartCmd (a Cubicle extension) is a shell command started in the
	// background at every cold boot of a sandbox from the snapshot; with
	// ReadyCmd, the sandbox is ready only once ReadyCmd exits 0.
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// Docker (a Cubicle extension): sandboxes created from the snapshot
	// run with Docker inside (see Sandbox.Docker) unless their create
	// says otherwise.
	Docker bool `json:"docker,omitempty"`
}

// SnapshotTag is one tag published under a snapshot name.
type SnapshotTag struct {
	Tag        string `json:"tag"`
	SnapshotID string `json:"snapshot_id"`
}

// SnapshotTags is the body of GET /snapshots-by-name/{name}.
type SnapshotTags struct {
	Name string        `json:"name"`
	Tags []SnapshotTag `json:"tags"`
}

// Sandbox is one isolated machine (spec §4.1).
type Sandbox struct {
	ID                     string     `json:"id"`
	Name                   string     `json:"name"`
	Status                 string     `json:"status"`
	StatusMessage          string     `json:"status_message,omitempty"`
	DataplaneURL           string     `json:"dataplane_url"`
	SnapshotID             string     `json:"snapshot_id"`
	VCPUs                  int64      `json:"vcpus"`
	MemBytes               int64      `json:"mem_bytes"`
	FSCapacityBytes        int64      `json:"fs_capacity_bytes"`
	FSUsedBytes            *int64     `json:"fs_used_bytes,omitempty"`
	IdleTTLSeconds         int64      `json:"idle_ttl_seconds"`
	DeleteAfterStopSeconds int64      `json:"delete_after_stop_seconds"`
	RunConfig              *RunConfig `json:"run_config,omitempty"`
	Runtime                string     `json:"runtime,omitempty"`
	CreatedBy              string     `json:"created_by,omitempty"`
	CreatedAt              time.Time  `json:"created_at"`
	UpdatedAt              time.Time  `json:"updated_at"`
	StoppedAt              *time.Time `json:"stopped_at"`
	// PreserveMemoryOnStop: a stop (explicit or idle) checkpoints the
	// sandbox's memory and the next start resumes its processes.
	PreserveMemoryOnStop bool `json:"preserve_memory_on_stop"`
	// CPUMillicores is the sandbox's CPU bandwidth (1000 = one core);
	// VCPUs is it rounded up, which quotas count.
	CPUMillicores int64 `json:"cpu_millicores"`
	// Labels are the sandbox's key/value metadata, its snapshot's
	// included.
	Labels map[string]string `json:"labels"`
	// Persistent: filesystem writes survive a stop. A sandbox that is not
	// boots from its snapshot afresh on every start.
	Persistent bool `json:"persistent"`
	// Volumes are the sandbox's volume attachments (as of its next start
	// when changed while it runs).
	Volumes []VolumeAttachment `json:"volumes,omitempty"`
	// Docker (a Cubicle extension, gvisor only): the sandbox runs with
	// what dockerd needs inside (raw and packet sockets, the
	// capabilities of a container host, a tmpfs /var/lib/docker), so
	// `docker run` and `docker build` work in it.
	Docker bool `json:"docker"`
}

// CreateSnapshotRequest is the body of POST /snapshots (spec S1).
type CreateSnapshotRequest struct {
	Name            string     `json:"name"`
	DockerImage     string     `json:"docker_image"`
	FSCapacityBytes int64      `json:"fs_capacity_bytes"`
	RegistryID      string     `json:"registry_id,omitempty"`
	RunConfig       *RunConfig `json:"run_config,omitempty"`
	// Tag is the Docker-style tag the snapshot takes under its name
	// (default "latest"); the snapshot that held it loses it.
	Tag string `json:"tag,omitempty"`
	// Labels seed the snapshot's labels.
	Labels map[string]string `json:"labels,omitempty"`
}

// BuildSnapshotRequest is a Dockerfile build (a Cubicle extension): POST
// /snapshots with a build context as the body — a tar with Content-Type
// application/x-tar, these fields as query parameters (build_arg=K=V,
// repeated, for BuildArgs), or multipart/form-data with these fields as
// form fields and the tar as the file field "context". The context's
// .dockerignore applies; Dockerfile, when empty, is the context's own.
type BuildSnapshotRequest struct {
	Name            string            `json:"name"`
	Tag             string            `json:"tag,omitempty"`
	Dockerfile      string            `json:"dockerfile,omitempty"`
	BuildArgs       map[string]string `json:"build_args,omitempty"`
	Target          string            `json:"target,omitempty"`
	NoCache         bool              `json:"no_cache,omitempty"`
	FSCapacityBytes int64             `json:"fs_capacity_bytes,omitempty"`
	// StartCmd overrides the start command the Dockerfile's ENTRYPOINT
	// and CMD give; ReadyCmd is its readiness probe (see Snapshot).
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
}

// CreateSandboxRequest is the body of POST /boxes (spec B1). Pointers mark
// fields whose absence differs from their zero value.
type CreateSandboxRequest struct {
	WaitForReady *bool  `json:"wait_for_ready,omitempty"`
	Timeout      *int64 `json:"timeout,omitempty"`
	SnapshotID   string `json:"snapshot_id,omitempty"`
	SnapshotName string `json:"snapshot_name,omitempty"`
	// Snapshot is the Python client's newer form of either: an id, a
	// name or a Docker-style name:tag (a bare name is name:latest, else
	// the newest snapshot of the name).
	Snapshot               string     `json:"snapshot,omitempty"`
	Name                   string     `json:"name,omitempty"`
	IdleTTLSeconds         *int64     `json:"idle_ttl_seconds,omitempty"`
	DeleteAfterStopSeconds *int64     `json:"delete_after_stop_seconds,omitempty"`
	VCPUs                  *int64     `json:"vcpus,omitempty"`
	MemBytes               *int64     `json:"mem_bytes,omitempty"`
	FSCapacityBytes        *int64     `json:"fs_capacity_bytes,omitempty"`
	RunConfig              *RunConfig `json:"run_config,omitempty"`
	// ProxyConfig is kept as raw JSON (spec §4.4): egress access control
	// and header injection, enforced by the daemon's egress proxy. Its
	// shape is ProxyConfig.
	ProxyConfig json.RawMessage `json:"proxy_config,omitempty"`
	// MountConfig (spec §4.5): S3, GCS and git mounts the daemon serves
	// into the sandbox, with their credentials (kept by the daemon). Its
	// shape is checked by the server (internal/mounts); contexthub mounts
	// are refused.
	MountConfig json.RawMessage `json:"mount_config,omitempty"`
	// AccessDelegation is accepted and checked but grants nothing yet:
	// Cubicle gives code in a sandbox no control-plane credential.
	AccessDelegation *AccessDelegation `json:"access_delegation,omitempty"`
	// PreserveMemoryOnStop is stored on the sandbox (see Sandbox).
	PreserveMemoryOnStop *bool `json:"preserve_memory_on_stop,omitempty"`
	// RestoreMemory chooses, for this boot only, what happens to the
	// snapshot's memory image: nil restores it when there is one, true
	// requires one, false boots cold.
	RestoreMemory *bool `json:"restore_memory,omitempty"`
	// CPUMillicores asks for CPU at millicore granularity and takes the
	// place of vcpus (which, if also given, must be it rounded up).
	CPUMillicores *int64 `json:"cpu_millicores,omitempty"`
	// EnvVars merge into run_config.env_vars (a key in both with
	// different values is refused).
	EnvVars map[string]string `json:"env_vars,omitempty"`
	// Labels are stored with the sandbox over its snapshot's.
	Labels map[string]string `json:"labels,omitempty"`
	// Persistent (default true): filesystem writes survive a stop.
	Persistent *bool `json:"persistent,omitempty"`
	// Docker asks for Docker inside (see Sandbox.Docker); absent, the
	// snapshot's setting applies.
	Docker *bool `json:"docker,omitempty"`
	// TagValueIDs (LangSmith resource tags) are not supported: a
	// non-empty list is refused.
	TagValueIDs []string `json:"tag_value_ids,omitempty"`
	// Volumes are persistent volumes of the workspace mounted into the
	// sandbox (a Cubicle extension; see volumes.go).
	Volumes []VolumeAttachment `json:"volumes,omitempty"`
	// Runtime (a Cubicle extension) is the runtime the sandbox runs on,
	// one of those the daemon serves (Health.Runtimes); empty, the
	// daemon's default. It is fixed for the sandbox's life; its forks
	// run on it too.
	Runtime string `json:"runtime,omitempty"`
}

// StartSandboxRequest is the optional body of POST /boxes/{name}/start.
type StartSandboxRequest struct {
	// RestoreMemory chooses what happens to the memory image a
	// memory-preserving stop left: nil restores it when there is one
	// (falling back to a cold boot if the restore fails), true requires
	// it (no image, or a failed restore, fails the start), false boots
	// cold and discards it. Also accepted as ?restore_memory=.
	RestoreMemory *bool `json:"restore_memory,omitempty"`
}

// UpdateSandboxRequest is the body of PATCH /boxes/{name} (spec B4). Every
// field is optional; an absent field is left unchanged, and a body with none
// set reads the sandbox like GET.
type UpdateSandboxRequest struct {
	Name                   *string    `json:"name,omitempty"`
	IdleTTLSeconds         *int64     `json:"idle_ttl_seconds,omitempty"`
	DeleteAfterStopSeconds *int64     `json:"delete_after_stop_seconds,omitempty"`
	RunConfig              *RunConfig `json:"run_config,omitempty"`
	// ProxyConfig is kept as raw JSON (spec §4.4, shape ProxyConfig); it
	// replaces the stored one and may only be changed while the sandbox is
	// ready.
	ProxyConfig json.RawMessage `json:"proxy_config,omitempty"`
	// VCPUs, MemBytes and FSCapacityBytes resize the sandbox (the
	// OpenAPI's PATCH extras, spec §3.5): CPU and memory from its next
	// start, the filesystem capacity at once.
	VCPUs           *int64 `json:"vcpus,omitempty"`
	MemBytes        *int64 `json:"mem_bytes,omitempty"`
	FSCapacityBytes *int64 `json:"fs_capacity_bytes,omitempty"`
	// PreserveMemoryOnStop replaces the stored flag; it applies from the
	// next stop.
	PreserveMemoryOnStop *bool `json:"preserve_memory_on_stop,omitempty"`
	// CPUMillicores resizes the CPU at millicore granularity (as on
	// create); vcpus alone resets it to whole cores.
	CPUMillicores *int64 `json:"cpu_millicores,omitempty"`
	// Labels, when present, replace the sandbox's labels ({} clears them).
	Labels map[string]string `json:"labels,omitempty"`
	// TagValueIDs: as on create, a non-empty list is refused.
	TagValueIDs []string `json:"tag_value_ids,omitempty"`
	// Volumes, when present, replace the sandbox's volume attachments
	// ([] detaches all); they take effect at its next start.
	Volumes *[]VolumeAttachment `json:"volumes,omitempty"`
}

// Empty reports whether the request changes nothing.
func (r UpdateSandboxRequest) Empty() bool {
	return r.Name == nil && r.IdleTTLSeconds == nil && r.DeleteAfterStopSeconds == nil && r.PreserveMemoryOnStop == nil &&
		r.RunConfig == nil && (len(r.ProxyConfig) == 0 || string(r.ProxyConfig) == "null") && !r.Resizes() &&
		r.Labels == nil && len(r.TagValueIDs) == 0 && r.Volumes == nil
}

// Resizes reports whether the request changes the sandbox's resources.
func (r UpdateSandboxRequest) Resizes() bool {
	return r.VCPUs != nil || r.CPUMillicores != nil || r.MemBytes != nil || r.FSCapacityBytes != nil
}

// Registry holds private image pull credentials of a workspace (spec §3.4).
// The password is write-only: it is never returned.
type Registry struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	URL       string    `json:"url"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by"`
}

// CreateRegistryRequest is the body of POST /registries (spec R1).
type CreateRegistryRequest struct {
	Name     string `json:"name"`
	URL      string `json:"url"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// UpdateRegistryRequest is the body of PATCH /registries/{name} (spec R4);
// absent fields are left unchanged.
type UpdateRegistryRequest struct {
	Name     *string `json:"name,omitempty"`
	URL      *string `json:"url,omitempty"`
	Username *string `json:"username,omitempty"`
	Password *string `json:"password,omitempty"`
}

// RegistryList is the body of GET /registries (spec R2).
type RegistryList struct {
	Registries []Registry `json:"registries"`
	Items      []Registry `json:"items"`
	Offset     int        `json:"offset"`
	NextCursor *string    `json:"next_cursor"`
}

// GlobRequest is the body of POST {dataplane}/glob (spec D7).
type GlobRequest struct {
	Pattern string `json:"pattern"`
	Path    string `json:"path"`
	Limit   int    `json:"limit,omitempty"`
}

// GrepRequest is the body of POST {dataplane}/grep (spec D8). Pattern is a
// literal string, not a regular expression.
type GrepRequest struct {
	Pattern string `json:"pattern"`
	Path    string `json:"path"`
	Glob    string `json:"glob,omitempty"`
	Limit   int    `json:"limit,omitempty"`
}

// GlobMatch is one entry a glob found; Path is absolute.
type GlobMatch struct {
	Path       string     `json:"path"`
	IsDir      bool       `json:"is_dir"`
	SizeBytes  int64      `json:"size_bytes"`
	ModifiedAt *time.Time `json:"modified_at,omitempty"`
}

// GlobResult is the answer to a GlobRequest; Truncated marks that the
// limit (or the server's cap on the answer) cut it short.
type GlobResult struct {
	Matches   []GlobMatch `json:"matches"`
	Truncated bool        `json:"truncated"`
}

// GrepMatch is one line a grep found; Line is 1-based.
type GrepMatch struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepResult is the answer to a GrepRequest, truncated as for GlobResult.
type GrepResult struct {
	Matches   []GrepMatch `json:"matches"`
	Truncated bool        `json:"truncated"`
}

// SandboxList is the body of GET /boxes.
type SandboxList struct {
	Sandboxes  []Sandbox `json:"sandboxes"`
	Items      []Sandbox `json:"items"`
	Offset     int       `json:"offset"`
	NextCursor *string   `json:"next_cursor"`
}

// SnapshotList is the body of GET /snapshots.
type SnapshotList struct {
	Snapshots  []Snapshot `json:"snapshots"`
	Items      []Snapshot `json:"items"`
	Offset     int        `json:"offset"`
	NextCursor *string    `json:"next_cursor"`
}

// StatusResponse is the body of GET /boxes/{name}/status.
type StatusResponse struct {
	Status        string `json:"status"`
	StatusMessage string `json:"status_message,omitempty"`
}

// ExecuteRequest is the body of POST {dataplane}/execute (spec D1).
type ExecuteRequest struct {
	Command   string            `json:"command"`
	Timeout   int64             `json:"timeout,omitempty"`
	Shell     string            `json:"shell,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	RunConfig *RunConfig        `json:"run_config,omitempty"`
}

// ExecuteResult is the response of POST {dataplane}/execute. The daemon
// keeps at most a fixed amount of each stream (16 MiB by default; `cubicle
// serve --exec-output-limit`): the rest is dropped, the stream's
// *_truncated is true and *_bytes counts what the command wrote in all.
// The official clients read stdout, stderr and exit_code and ignore the
// other fields; use the WebSocket exec for larger output.
type ExecuteResult struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int    `json:"exit_code"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	StdoutBytes     int64  `json:"stdout_bytes,omitempty"`
	StderrBytes     int64  `json:"stderr_bytes,omitempty"`
}

// Exec frame types (spec §6). Client → server: execute, reconnect, input,
// close_stdin, kill. Server → client: started, stdout, stderr, exit, error.
const (
	FrameExecute    = "execute"
	FrameReconnect  = "reconnect"
	FrameInput      = "input"
	FrameCloseStdin = "close_stdin"
	FrameKill       = "kill"
	FrameResize     = "resize" // Cubicle extension: PTY window size
	FrameStarted    = "started"
	FrameStdout     = "stdout"
	FrameStderr     = "stderr"
	FrameExit       = "exit"
	FrameError      = "error"
)

// Exec error types carried by FrameError.
const (
	ErrCommandTimeout  = "CommandTimeout"
	ErrCommandNotFound = "CommandNotFound"
	ErrSessionExpired  = "SessionExpired"
	ErrCommandError    = "CommandError"
)

// EncodingBase64 is the one ExecFrame.Encoding there is.
const EncodingBase64 = "base64"

// ExecFrame is one JSON text frame of the WebSocket exec protocol, in either
// direction. Only the fields meaningful for Type are set.
type ExecFrame struct {
	Type string `json:"type"`

	// execute
	Command            string            `json:"command,omitempty"`
	TimeoutSeconds     *int64            `json:"timeout_seconds,omitempty"`
	Shell              string            `json:"shell,omitempty"`
	IdleTimeoutSeconds *int64            `json:"idle_timeout_seconds,omitempty"`
	KillOnDisconnect   bool              `json:"kill_on_disconnect,omitempty"`
	TTLSeconds         *int64            `json:"ttl_seconds,omitempty"`
	Env                map[string]string `json:"env,omitempty"`
	Cwd                string            `json:"cwd,omitempty"`
	RunConfig          *RunConfig        `json:"run_config,omitempty"`
	CloseStdin         bool              `json:"close_stdin,omitempty"`
	PTY                bool              `json:"pty,omitempty"`
	Rows               int               `json:"rows,omitempty"`
	Cols               int               `json:"cols,omitempty"`

	// execute, reconnect, started
	CommandID string `json:"command_id,omitempty"`
	// execute, reconnect, started: Encoding is a Cubicle extension that
	// makes a connection binary-safe. A client sends EncodingBase64 on its
	// first frame; a server that supports it answers the same value on
	// started, and from then on the connection's stdout, stderr and input
	// frames carry Data as standard base64 of the exact bytes (offsets stay
	// byte offsets). Without that answer — the official clients never ask —
	// Data is UTF-8 text, as the protocol specifies.
	Encoding string `json:"encoding,omitempty"`
	// reconnect
	StdoutOffset int64 `json:"stdout_offset,omitempty"`
	StderrOffset int64 `json:"stderr_offset,omitempty"`

	// started
	PID int `json:"pid,omitempty"`
	// input, stdout, stderr
	Data string `json:"data,omitempty"`
	// stdout, stderr: byte offset of Data's first byte within its stream.
	Offset *int64 `json:"offset,omitempty"`
	// exit
	ExitCode *int `json:"exit_code,omitempty"`
	// error
	ErrorType string `json:"error_type,omitempty"`
	Error     string `json:"error,omitempty"`
}

// FrameData returns the bytes an input or output frame carries: its Data
// as text, or decoded from base64 on a binary connection.
func FrameData(f ExecFrame, binary bool) ([]byte, error) {
	if !binary {
		return []byte(f.Data), nil
	}
	b, err := base64.StdEncoding.DecodeString(f.Data)
	if err != nil {
		return nil, fmt.Errorf("%s frame: data is not base64: %w", f.Type, err)
	}
	return b, nil
}

// ErrorDetail is the structured error body (spec §2 form 1).
type ErrorDetail struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// ErrorBody wraps ErrorDetail as {"detail": {...}}.
type ErrorBody struct {
	Detail ErrorDetail `json:"detail"`
}

// ValidationItem is one entry of a 422 body in the Pydantic form (spec §2
// form 2): {"detail": [{"loc": [...], "msg": "...", "type": "value_error"}]}.
type ValidationItem struct {
	Loc  []string `json:"loc"`
	Msg  string   `json:"msg"`
	Type string   `json:"type"`
}

// ValidationBody is a 422 body.
type ValidationBody struct {
	Detail []ValidationItem `json:"detail"`
}

// SnapshotPool is a snapshot's warm pool: Size pre-booted instances that
// creates from the snapshot claim instead of booting, each recycled after
// MaxAgeSeconds (0: never). Ready is how many are up now.
type SnapshotPool struct {
	SnapshotID    string `json:"snapshot_id"`
	Size          int64  `json:"size"`
	MaxAgeSeconds int64  `json:"max_age_seconds"`
	Ready         int    `json:"ready"`
}

// SetSnapshotPoolRequest is the body of PUT …/snapshots/{id}/pool; size
// 0 removes the pool.
type SetSnapshotPoolRequest struct {
	Size          int64 `json:"size"`
	MaxAgeSeconds int64 `json:"max_age_seconds,omitempty"`
}

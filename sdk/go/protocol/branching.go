package protocol

// CaptureSnapshotRequest is the body of POST /boxes/{name}/snapshot (spec
// X1): snapshot a sandbox's filesystem as it is now, while it keeps running.
type CaptureSnapshotRequest struct {
	Name string `json:"name"`
	// DockerImage exports an image from the sandbox's Docker (a sandbox
	// created with docker: true) as a snapshot; without Docker inside it
	// is a 422.
	DockerImage     string     `json:"docker_image,omitempty"`
	FSCapacityBytes *int64     `json:"fs_capacity_bytes,omitempty"`
	RunConfig       *RunConfig `json:"run_config,omitempty"`
	// IncludeMemory (or its alias Checkpoint) also saves the sandbox's
	// memory: sandboxes created from the snapshot resume its processes
	// instead of booting. gvisor runtime only; others answer 422.
	IncludeMemory bool `json:"include_memory,omitempty"`
	Checkpoint    bool `json:"checkpoint,omitempty"`
	// Tag is the Docker-style tag the snapshot takes under its name, as
	// on CreateSnapshotRequest.
	Tag string `json:"tag,omitempty"`
	// Labels seed the snapshot's labels over the sandbox's own.
	Labels map[string]string `json:"labels,omitempty"`
}

// ForkRequest is the body of POST /boxes/{name}/fork (a Cubicle
// extension): capture the sandbox and boot Count branches from the capture.
type ForkRequest struct {
	Count int `json:"count"`
	// Names of the branches (len == Count); generated when empty.
	Names []string `json:"names,omitempty"`
	// SnapshotName names the captured snapshot (default "<name>-fork-<hex>").
	SnapshotName string `json:"snapshot_name,omitempty"`
	// Timeout bounds the wait for every branch to be ready, in seconds
	// (default 60).
	Timeout *int64 `json:"timeout,omitempty"`
	// IncludeMemory captures memory too and restores every branch from it:
	// branches resume the parent's running processes (gvisor runtime only).
	IncludeMemory bool `json:"include_memory,omitempty"`
}

// ForkResponse is the result of a fork: the captured snapshot and the
// branches, each booted from it.
type ForkResponse struct {
	SnapshotID string    `json:"snapshot_id"`
	Sandboxes  []Sandbox `json:"sandboxes"`
}

// ResetRequest is the body of POST /boxes/{name}/reset: discard everything
// the sandbox wrote and restart it from SnapshotID (default: its own
// snapshot).
type ResetRequest struct {
	SnapshotID string `json:"snapshot_id,omitempty"`
}

// Diff change kinds.
const (
	DiffAdded    = "added"
	DiffModified = "modified"
	DiffDeleted  = "deleted"
)

// DiffEntry is one path that differs between two filesystems.
type DiffEntry struct {
	Path string `json:"path"`
	// Kind is DiffAdded, DiffModified or DiffDeleted; a rename is a delete
	// of the old path plus an add of the new one.
	Kind string `json:"kind"`
	// SizeBytes is the file's size where it exists (B unless deleted).
	SizeBytes int64 `json:"size_bytes"`
}

// DiffResponse is the body of GET /diff?a=&b=: how to get from A to B.
type DiffResponse struct {
	A       string      `json:"a"`
	B       string      `json:"b"`
	Changes []DiffEntry `json:"changes"`
}

package protocol

// Quota is a workspace's ceilings, the body of PUT and the answer of GET
// /workspaces/{id}/quotas. A null (absent) member is unlimited; a PUT
// replaces every member, so it sets absent ones unlimited.
//
//   - MaxSandboxes counts every sandbox not being deleted (running,
//     stopped, provisioning, failed).
//   - MaxVCPUs and MaxMemBytes bound the sum over running sandboxes
//     (provisioning or ready).
//   - MaxStorageBytes bounds the sum of the sandboxes' declared
//     fs_capacity_bytes.
//   - MaxSnapshots counts every snapshot.
type Quota struct {
	MaxSandboxes    *int64 `json:"max_sandboxes"`
	MaxVCPUs        *int64 `json:"max_vcpus"`
	MaxMemBytes     *int64 `json:"max_mem_bytes"`
	MaxStorageBytes *int64 `json:"max_storage_bytes"`
	MaxSnapshots    *int64 `json:"max_snapshots"`
}

// WorkspaceQuota is a workspace's quotas as GET and PUT answer them.
type WorkspaceQuota struct {
	WorkspaceID string `json:"workspace_id"`
	Quota
}

// Usage is GET /workspaces/{id}/usage: what the workspace holds now, each
// member measured as the quota of the same name (max_<member>) counts it,
// plus FSUsedBytes, the bytes its sandboxes and captured snapshots hold
// on disk (measured on the copy-on-write store; 0 where the backend
// cannot measure).
type Usage struct {
	WorkspaceID  string `json:"workspace_id"`
	Sandboxes    int64  `json:"sandboxes"`
	VCPUs        int64  `json:"vcpus"`
	MemBytes     int64  `json:"mem_bytes"`
	StorageBytes int64  `json:"storage_bytes"`
	Snapshots    int64  `json:"snapshots"`
	FSUsedBytes  int64  `json:"fs_used_bytes"`
}

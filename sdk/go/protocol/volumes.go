package protocol

import "time"

// Persistent volumes (a Cubicle extension): per-workspace directories on
// the daemon's copy-on-write store that outlive sandboxes, are attached to
// any number of them at once, and have their own read-only snapshots from
// which new volumes are cloned copy-on-write.

// CreateVolumeRequest is the body of POST /volumes: an empty volume of
// SizeBytes, or, with FromSnapshot, a clone of a volume snapshot (SizeBytes
// then defaults to the snapshot's).
type CreateVolumeRequest struct {
	Name         string `json:"name"`
	SizeBytes    int64  `json:"size_bytes,omitempty"`
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// Volume is a persistent volume.
type Volume struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	SizeBytes int64  `json:"size_bytes"`
	// UsedBytes is what only this volume holds on the store (data it
	// shares with the snapshot it was cloned from costs nothing); absent
	// when it could not be measured.
	UsedBytes *int64 `json:"used_bytes,omitempty"`
	// FromSnapshot is the id of the volume snapshot it was cloned from.
	FromSnapshot string    `json:"from_snapshot,omitempty"`
	CreatedBy    string    `json:"created_by,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	// Attachments are the sandboxes (running or stopped) that mount it.
	Attachments []VolumeUse `json:"attachments"`
}

// VolumeUse is one sandbox's attachment of a volume.
type VolumeUse struct {
	SandboxID   string `json:"sandbox_id"`
	SandboxName string `json:"sandbox_name"`
	MountPath   string `json:"mount_path"`
	ReadOnly    bool   `json:"read_only"`
}

// VolumeList is the body of GET /volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// VolumeAttachment mounts volume Name at MountPath in a sandbox
// (CreateSandboxRequest.Volumes, UpdateSandboxRequest.Volumes).
type VolumeAttachment struct {
	Name      string `json:"name"`
	MountPath string `json:"mount_path"`
	ReadOnly  bool   `json:"read_only,omitempty"`
}

// SnapshotVolumeRequest is the body of POST /volumes/{name}/snapshot.
type SnapshotVolumeRequest struct {
	Name string `json:"name"`
}

// VolumeSnapshot is a read-only, point-in-time copy of a volume sharing
// its data copy-on-write. It outlives the volume it was taken from.
type VolumeSnapshot struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	VolumeID   string `json:"volume_id"`
	VolumeName string `json:"volume_name,omitempty"`
	// SizeBytes is the volume's size when taken: a clone's default.
	SizeBytes int64     `json:"size_bytes"`
	UsedBytes *int64    `json:"used_bytes,omitempty"`
	CreatedBy string    `json:"created_by,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// VolumeSnapshotList is the body of GET /volume-snapshots.
type VolumeSnapshotList struct {
	Snapshots []VolumeSnapshot `json:"snapshots"`
}

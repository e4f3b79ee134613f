package sandbox

import (
	"context"

	"github.com/cubicle-dev/cubicle/internal/network"
)

// Storage is what the manager calls on sandbox filesystems: an overlay
// rootfs per sandbox over snapshot layers, on a copy-on-write store.
// internal/storage.Overlays implements it; sandboxtest.Storage fakes it.
// Ids are runtime ids (runtimeID), snapshot names are snapshot ids.
type Storage interface {
	// Backend names the CoW backend, for logs and the API.
	Backend() string
	// Prepare creates the sandbox's upper dir unless it exists and returns it.
	Prepare(ctx context.Context, id string) (string, error)
	// Mount mounts the rootfs over layers (bottom first) and returns its path.
	Mount(ctx context.Context, id string, layers []string) (string, error)
	// Unmount unmounts the rootfs; not mounted is not an error.
	Unmount(ctx context.Context, id string) error
	// Remove deletes everything the sandbox wrote.
	Remove(ctx context.Context, id string) error
	// Reset empties the (unmounted) sandbox's upper dir.
	Reset(ctx context.Context, id string) error
	// UpperDir is where the sandbox's writes land.
	UpperDir(id string) string
	// Limit caps the sandbox's filesystem, reporting whether it is enforced.
	Limit(ctx context.Context, id string, bytes int64) (enforced bool, err error)
	// Flush writes dirty data back before a freeze.
	Flush(ctx context.Context, id string) error
	// Capture snapshots the (frozen) upper dir as snapshot snap's layer.
	Capture(ctx context.Context, id, snap string) (string, error)
	// CaptureLayer is the layer path Capture gives snapshot snap.
	CaptureLayer(snap string) string
	// RemoveCapture deletes snap's captured layer and memory image.
	RemoveCapture(ctx context.Context, snap string) error
	// MemoryDir is where snapshot snap keeps a memory image.
	MemoryDir(snap string) string
	// Usage is the exclusive bytes of sandboxes ids and snapshots snaps.
	Usage(ctx context.Context, ids, snaps []string) (map[string]int64, error)
	// List returns the ids that hold storage.
	List(ctx context.Context) ([]string, error)
	// ListCaptures returns the ids captured layers are kept under.
	ListCaptures(ctx context.Context) ([]string, error)
	// QuarantineCapture moves capture snap's layer and memory image aside
	// (never deleting them), returning where.
	QuarantineCapture(ctx context.Context, snap string) (string, error)
	// Quarantine unmounts id's rootfs and moves what it wrote aside
	// (never deleting it), returning where ("" if it wrote nothing).
	Quarantine(ctx context.Context, id string) (string, error)

	VolumeStorage
}

// VolumeStorage is what the manager calls on persistent volumes: one
// directory per volume on the CoW store, limited to its size, with
// read-only snapshots and copy-on-write clones of them. Ids are volume
// and volume snapshot ids.
type VolumeStorage interface {
	// VolumePath is the directory sandboxes mount for volume id.
	VolumePath(id string) string
	// CreateVolume makes empty volume id of size bytes, reporting
	// whether the size is enforced.
	CreateVolume(ctx context.Context, id string, size int64) (enforced bool, err error)
	// CloneVolume makes volume id a writable copy of snapshot snap.
	CloneVolume(ctx context.Context, snap, id string, size int64) (enforced bool, err error)
	// SnapshotVolume takes read-only snapshot snap of volume id.
	SnapshotVolume(ctx context.Context, id, snap string) error
	// RemoveVolume and RemoveVolumeSnapshot delete one; missing is fine.
	RemoveVolume(ctx context.Context, id string) error
	RemoveVolumeSnapshot(ctx context.Context, snap string) error
	// VolumeUsage is the exclusive bytes of volumes ids and snapshots snaps.
	VolumeUsage(ctx context.Context, ids, snaps []string) (map[string]int64, error)
	// ListVolumeFiles returns the ids holding volume files (volume
	// snapshots' when snapshots); QuarantineVolumeFiles moves one's files
	// aside (never deleting them), returning where.
	ListVolumeFiles(ctx context.Context, snapshots bool) ([]string, error)
	QuarantineVolumeFiles(ctx context.Context, snapshot bool, id string) (string, error)
}

// Network is what the manager calls on sandbox networks: one netns and
// address per sandbox. internal/network.Manager implements it;
// sandboxtest.Network fakes it.
type Network interface {
	// Setup builds (or repairs) id's endpoint.
	Setup(ctx context.Context, id string) (*network.Endpoint, error)
	// Lookup returns id's existing endpoint.
	Lookup(ctx context.Context, id string) (*network.Endpoint, error)
	// Teardown removes id's endpoint; none is not an error.
	Teardown(ctx context.Context, id string) error
	// List returns the ids that hold an endpoint.
	List(ctx context.Context) ([]string, error)
}

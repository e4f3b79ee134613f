package protocol

// Health is GET /healthz (Cubicle's; no key needed). OK, Runtime and
// Storage are as before health checks existed; Status is "ok", "degraded"
// (served, with Reasons) or "unavailable" (the answer is a 503: new
// sandboxes cannot be created).
type Health struct {
	OK      bool          `json:"ok"`
	Status  string        `json:"status"`
	Reasons []string      `json:"reasons,omitempty"`
	Checks  []HealthCheck `json:"checks,omitempty"`
	// Runtime and Accelerator are the default runtime's (of creates that
	// name none); Runtimes are all the daemon serves, the default first.
	Runtime string `json:"runtime"`
	// Accelerator is the microvm runtime's: kvm or tcg.
	Accelerator string          `json:"accelerator,omitempty"`
	Runtimes    []ServedRuntime `json:"runtimes,omitempty"`
	// Storage is the copy-on-write backend: btrfs, btrfs-loop or copy.
	Storage string      `json:"storage"`
	Space   *StoreSpace `json:"space,omitempty"`
}

// ServedRuntime is one runtime a daemon serves (--runtime).
type ServedRuntime struct {
	Name string `json:"name"`
	// Accelerator is the microvm runtime's: kvm or tcg.
	Accelerator string `json:"accelerator,omitempty"`
}

// HealthCheck is one probed part of the daemon.
type HealthCheck struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

// StoreSpace is the room the copy-on-write store has: its own filesystem
// and, for a loop image, the host filesystem the image file lives on (a
// sparse image can claim more than the host has left). Usable is the
// smaller of their free space: what the store can still take.
type StoreSpace struct {
	Store  FSSpace  `json:"store"`
	Host   *FSSpace `json:"host,omitempty"`
	Usable int64    `json:"usable_bytes"`
	// Metadata is the btrfs store's metadata space (absent on other
	// backends).
	Metadata *MetadataSpace `json:"metadata,omitempty"`
}

// MetadataSpace is a btrfs store's metadata space, in bytes: Total is held
// by metadata chunks, Used of it in use, Unallocated is device space no
// chunk holds yet, and Free is what metadata can still take (the free part
// of its chunks less the kernel's global reserve, plus what a new chunk
// could take of Unallocated). A btrfs out of metadata turns read-only
// however much data space it has left; Reserve is the Free the daemon keeps
// (below it, health fails and the store is balanced).
type MetadataSpace struct {
	Total       int64 `json:"total_bytes"`
	Used        int64 `json:"used_bytes"`
	Free        int64 `json:"free_bytes"`
	Unallocated int64 `json:"unallocated_bytes"`
	Reserve     int64 `json:"reserve_bytes"`
}

// FSSpace is what one filesystem holds and has left, in bytes. ReadOnly is
// set when it no longer takes writes (btrfs turns itself read-only after
// an aborted transaction, e.g. when it ran out of space).
type FSSpace struct {
	Path     string `json:"path"`
	Total    int64  `json:"total_bytes"`
	Used     int64  `json:"used_bytes"`
	Free     int64  `json:"free_bytes"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Leftover is host state held under a runtime id that no sandbox record
// has (GET /v2/sandboxes/admin/leftovers, instance admin only): Kind is
// runtime, network or storage. Moved is where a cleaned storage
// leftover's data went (the daemon moves unknown data aside, never deletes
// it).
type Leftover struct {
	Kind  string `json:"kind"`
	ID    string `json:"id"`
	Moved string `json:"moved,omitempty"`
	// Runtime names the driver holding a runtime leftover.
	Runtime string `json:"runtime,omitempty"`
}

// Leftovers is the answer of the leftovers routes.
type Leftovers struct {
	Leftovers []Leftover `json:"leftovers"`
}

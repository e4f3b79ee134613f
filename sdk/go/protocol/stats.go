package protocol

import "time"

// SandboxStats is a sandbox's resource use at SampledAt (GET
// …/boxes/{name}/stats). The counters are cumulative since the instance
// started; a rate (CPU %, bytes/s) is the difference of two samples over
// the difference of their SampledAt. A sandbox that is not running has
// only its disk use.
type SandboxStats struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Status    string    `json:"status"`
	Runtime   string    `json:"runtime"`
	SampledAt time.Time `json:"sampled_at"`
	// VCPUs is the CPU limit, the 100 % of CPUPercent-style displays
	// being one core.
	VCPUs      int64   `json:"vcpus"`
	CPUSeconds float64 `json:"cpu_seconds"`
	// MemoryBytes is the memory charged to the sandbox on the host.
	MemoryBytes      int64 `json:"memory_bytes"`
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
	// DiskBytes is what the sandbox alone holds on the store
	// (fs_used_bytes); -1 when the backend cannot tell.
	DiskBytes      int64 `json:"disk_bytes"`
	DiskLimitBytes int64 `json:"disk_limit_bytes"`
	NetRxBytes     int64 `json:"net_rx_bytes"`
	NetTxBytes     int64 `json:"net_tx_bytes"`
}

// SandboxStatsList is the stats of every sandbox the caller may see
// (GET …/stats).
type SandboxStatsList struct {
	Sandboxes []SandboxStats `json:"sandboxes"`
}

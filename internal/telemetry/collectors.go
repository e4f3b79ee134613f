package telemetry

import (
	"context"
	"os"
	"time"

	"github.com/cubicle-dev/cubicle/internal/health"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/prometheus/client_golang/prometheus"
)

// Census lists every sandbox with its state, and the usage of the running
// ones it measured (sandbox.Manager.Census; it bounds how many).
type Census func(ctx context.Context) ([]protocol.SandboxStats, error)

// censusTimeout bounds one scrape's census.
const censusTimeout = 10 * time.Second

var (
	descSandboxes = prometheus.NewDesc("cubicle_sandboxes", "Sandboxes by state and runtime.", []string{"state", "runtime"}, nil)
	descCPU       = prometheus.NewDesc("cubicle_sandbox_cpu_seconds_total", "CPU time used by a running sandbox's instance.", []string{"sandbox"}, nil)
	descMem       = prometheus.NewDesc("cubicle_sandbox_memory_bytes", "Memory charged to a running sandbox.", []string{"sandbox"}, nil)
	descDisk      = prometheus.NewDesc("cubicle_sandbox_disk_bytes", "Bytes a running sandbox alone holds on the store.", []string{"sandbox"}, nil)
	descRx        = prometheus.NewDesc("cubicle_sandbox_network_receive_bytes_total", "Bytes a running sandbox received.", []string{"sandbox"}, nil)
	descTx        = prometheus.NewDesc("cubicle_sandbox_network_transmit_bytes_total", "Bytes a running sandbox sent.", []string{"sandbox"}, nil)
)

// sandboxCollector computes the sandbox gauges at scrape time from a
// census: nothing is kept between scrapes, so deleted sandboxes' series
// vanish with them and cardinality is what the census bounds it to.
type sandboxCollector struct{ census Census }

func (c sandboxCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descCPU, descMem, descDisk, descRx, descTx} {
		ch <- d
	}
}

func (c sandboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), censusTimeout)
	defer cancel()
	all, err := c.census(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descSandboxes, err)
		return
	}
	type key struct{ state, runtime string }
	counts := map[key]int{}
	for _, st := range all {
		counts[key{st.Status, st.Runtime}]++
		if st.Status != protocol.StatusReady || st.SampledAt.IsZero() {
			continue
		}
		if st.CPUSeconds == 0 && st.MemoryBytes == 0 {
			continue // not measured (past the census's bound, or unreadable)
		}
		ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, st.CPUSeconds, st.ID)
		ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, float64(st.MemoryBytes), st.ID)
		if st.DiskBytes >= 0 {
			ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(st.DiskBytes), st.ID)
		}
		ch <- prometheus.MustNewConstMetric(descRx, prometheus.CounterValue, float64(st.NetRxBytes), st.ID)
		ch <- prometheus.MustNewConstMetric(descTx, prometheus.CounterValue, float64(st.NetTxBytes), st.ID)
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), k.state, k.runtime)
	}
}

// WatchSandboxes registers the sandbox gauges, computed from census at
// every scrape.
func (t *Telemetry) WatchSandboxes(census Census) {
	t.reg.MustRegister(sandboxCollector{census})
}

// WatchStoreFile registers cubicle_store_size_bytes: the size of the
// SQLite database at path with its write-ahead log.
func (t *Telemetry) WatchStoreFile(path string) {
	t.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cubicle", Name: "store_size_bytes",
		Help: "Size of the state database, write-ahead log included."}, func() float64 {
		var n int64
		for _, p := range []string{path, path + "-wal"} {
			if fi, err := os.Stat(p); err == nil {
				n += fi.Size()
			}
		}
		return float64(n)
	}))
}

var (
	descHealth = prometheus.NewDesc("cubicle_health_ok", "1 while a health check passes, 0 while it fails (its reason is in /healthz).", []string{"check"}, nil)
	descSpace  = prometheus.NewDesc("cubicle_store_space_bytes",
		"Space of the copy-on-write store's filesystem (fs=store) and, for a loop image, of the host filesystem holding it (fs=host).", []string{"fs", "kind"}, nil)
	descUsable = prometheus.NewDesc("cubicle_store_usable_bytes", "What the copy-on-write store can still take: the smaller of its own and its host filesystem's free space.", nil, nil)
	descMeta   = prometheus.NewDesc("cubicle_store_metadata_bytes",
		"The btrfs store's metadata space: kind=total (held by metadata chunks), used, free (what metadata can still take), unallocated (device space no chunk holds), reserve (the free the daemon keeps).", []string{"kind"}, nil)
)

// healthCollector reports the health checks and the store's space at
// scrape time (checks run at most once a second however often it is
// scraped).
type healthCollector struct {
	checks *health.Checker
	space  func() (protocol.StoreSpace, error)
}

func (c healthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descHealth
	ch <- descSpace
	ch <- descUsable
	ch <- descMeta
}

func (c healthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), censusTimeout)
	defer cancel()
	for _, r := range c.checks.Recent(ctx, time.Second).Checks {
		v := 0.0
		if r.Status == health.StatusOK {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descHealth, prometheus.GaugeValue, v, r.Name)
	}
	sp, err := c.space()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descSpace, err)
		return
	}
	emit := func(fs string, s protocol.FSSpace) {
		for kind, n := range map[string]int64{"total": s.Total, "used": s.Used, "free": s.Free} {
			ch <- prometheus.MustNewConstMetric(descSpace, prometheus.GaugeValue, float64(n), fs, kind)
		}
	}
	emit("store", sp.Store)
	if sp.Host != nil {
		emit("host", *sp.Host)
	}
	ch <- prometheus.MustNewConstMetric(descUsable, prometheus.GaugeValue, float64(sp.Usable))
	if m := sp.Metadata; m != nil {
		for kind, n := range map[string]int64{"total": m.Total, "used": m.Used, "free": m.Free, "unallocated": m.Unallocated, "reserve": m.Reserve} {
			ch <- prometheus.MustNewConstMetric(descMeta, prometheus.GaugeValue, float64(n), kind)
		}
	}
}

// WatchHealth registers cubicle_health_ok per check and the store's space
// gauges.
func (t *Telemetry) WatchHealth(checks *health.Checker, space func() (protocol.StoreSpace, error)) {
	t.reg.MustRegister(healthCollector{checks, space})
}

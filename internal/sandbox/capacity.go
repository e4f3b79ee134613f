package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/dustin/go-humanize"
)

// HostCapacity is what the host can take: how many boots run at once,
// how many creates and starts may wait for one, and the memory and store
// space a new instance needs. Past any of them a create, a start or a
// warm-pool refill is refused with an errdefs.CapacityError (a 503 with
// Retry-After) instead of booting into a host that cannot hold it.
type HostCapacity struct {
	// MaxBoots is how many instances prepare (rootfs, network, runtime,
	// agent) at once; the rest wait their turn. Unbounded, a burst of a
	// hundred boots on two cores storms the kernel's network locks (the
	// network phase's p50 reached 3.6 s, its max 10 s) for no gain in
	// throughput, which the CPUs bound. Default DefaultMaxBoots().
	MaxBoots int
	// BootQueue is how many creates and starts may wait for a boot slot;
	// past it they are refused. Default 64 per CPU: a gVisor boot costs
	// about a quarter of a core-second, so a full queue drains in about
	// 16 s, within a create's default 30 s wait for ready.
	BootQueue int
	// MemAvailable reads the memory the host can still give
	// (/proc/meminfo's MemAvailable, ReadMemAvailable); nil: memory is
	// not checked.
	MemAvailable func() (int64, error)
	// MemReserve is memory kept for the host: an instance is refused
	// when MemAvailable less MemReserve is below its mem_bytes.
	MemReserve int64
	// StoreUsable reads the bytes the copy-on-write store can still take;
	// nil: store space is not checked.
	StoreUsable func() (int64, error)
	// StoreReserve is store space kept free: an instance is refused when
	// StoreUsable is below it.
	StoreReserve int64
}

// DefaultMaxBoots is the default HostCapacity.MaxBoots: eight per CPU
// (a boot spends much of its time waiting on runsc's processes and the
// agent; fewer slots left CPUs idle during a burst).
func DefaultMaxBoots() int { return 8 * goruntime.NumCPU() }

// capacityRetry is the Retry-After of a refusal for memory or store
// space: the host frees them only as sandboxes stop or are deleted.
const capacityRetry = 30 * time.Second

// bootGate admits boots within HostCapacity. Its invariants: at most
// MaxBoots hold a slot; at most MaxBoots+BootQueue creates and starts are
// admitted and not yet done.
type bootGate struct {
	cap   HostCapacity
	slots chan struct{} // one token per boot preparing now

	mu       sync.Mutex
	admitted int // creates and starts between admit and done
	// avgBoot is a moving average of slot hold times, for Retry-After.
	avgBoot time.Duration
}

func newBootGate(c HostCapacity) *bootGate {
	if c.MaxBoots <= 0 {
		c.MaxBoots = DefaultMaxBoots()
	}
	if c.BootQueue <= 0 {
		c.BootQueue = 64 * goruntime.NumCPU()
	}
	return &bootGate{cap: c, slots: make(chan struct{}, c.MaxBoots), avgBoot: 200 * time.Millisecond}
}

// admit takes a place for a create or start of an instance of memBytes,
// or refuses it (CapacityError) when the queue is full or the host lacks
// the memory or store space. The caller calls done once its boot ends.
func (g *bootGate) admit(memBytes int64) (done func(), err error) {
	if err := g.room(memBytes); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if limit := g.cap.MaxBoots + g.cap.BootQueue; g.admitted >= limit {
		// Each slot frees about once per average boot: the queue
		// drains in queue/slots of them.
		wait := time.Duration(g.admitted/g.cap.MaxBoots+1) * g.avgBoot
		return nil, &errdefs.CapacityError{
			Msg:        fmt.Sprintf("%d boots running or waiting (at most %d at once, %d waiting)", g.admitted, g.cap.MaxBoots, g.cap.BootQueue),
			RetryAfter: wait,
		}
	}
	g.admitted++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			g.admitted--
			g.mu.Unlock()
		})
	}, nil
}

// room refuses an instance of memBytes the host lacks memory or store
// space for.
func (g *bootGate) room(memBytes int64) error {
	if g.cap.MemAvailable != nil {
		avail, err := g.cap.MemAvailable()
		if err != nil {
			return fmt.Errorf("read the host's available memory: %w", err)
		}
		if free := avail - g.cap.MemReserve; free < memBytes {
			return &errdefs.CapacityError{
				Msg: fmt.Sprintf("the host has %s of memory available above its %s reserve, the sandbox asks for mem_bytes %s",
					humanize.IBytes(uint64(max(free, 0))), humanize.IBytes(uint64(g.cap.MemReserve)), humanize.IBytes(uint64(memBytes))),
				RetryAfter: capacityRetry,
			}
		}
	}
	if g.cap.StoreUsable != nil {
		usable, err := g.cap.StoreUsable()
		if err != nil {
			return fmt.Errorf("measure the store's free space: %w", err)
		}
		if usable < g.cap.StoreReserve {
			return &errdefs.CapacityError{
				Msg: fmt.Sprintf("the store has %s usable, below its %s reserve",
					humanize.IBytes(uint64(max(usable, 0))), humanize.IBytes(uint64(g.cap.StoreReserve))),
				RetryAfter: capacityRetry,
			}
		}
	}
	return nil
}

// slot waits for a boot slot until ctx ends and returns its release.
func (g *bootGate) slot(ctx context.Context) (release func(), err error) {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for one of %d boot slots: %w", g.cap.MaxBoots, context.Cause(ctx))
	}
	t0 := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			<-g.slots
			g.mu.Lock()
			g.avgBoot = (7*g.avgBoot + time.Since(t0)) / 8
			g.mu.Unlock()
		})
	}, nil
}

// ReadMemAvailable is the host's MemAvailable from /proc/meminfo, in
// bytes: the memory it can give without swapping (HostCapacity's
// MemAvailable).
func ReadMemAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseMemAvailable(f)
}

// parseMemAvailable reads the MemAvailable line of a /proc/meminfo.
func parseMemAvailable(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("meminfo MemAvailable %q: %w", rest, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("meminfo has no MemAvailable line")
}

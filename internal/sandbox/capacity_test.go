package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// fakeHost is a host whose available memory and store space a test sets.
type fakeHost struct{ mem, store atomic.Int64 }

func (h *fakeHost) capacity(c HostCapacity) envOption {
	return func(cfg *Config) {
		c.MemAvailable = func() (int64, error) { return h.mem.Load(), nil }
		c.StoreUsable = func() (int64, error) { return h.store.Load(), nil }
		cfg.Capacity = c
	}
}

// wantCapacityError fails unless err is a CapacityError saying want, with
// a Retry-After.
func wantCapacityError(t *testing.T, err error, want string) {
	t.Helper()
	var ce *errdefs.CapacityError
	if !errors.As(err, &ce) || !errors.Is(err, errdefs.ErrUnavailable) || ce.RetryAfter <= 0 || !strings.Contains(ce.Error(), want) {
		t.Fatalf("got %v, want a CapacityError with Retry-After saying %q", err, want)
	}
}

// A create whose mem_bytes exceeds the host's available memory less the
// reserve, or one while the store is below its reserve, is refused with a
// CapacityError and leaves no record; one that fits boots.
func TestCreateRefusedPastHostCapacity(t *testing.T) {
	h := &fakeHost{}
	h.mem.Store(3 << 30)
	h.store.Store(10 << 30)
	e := newEnv(t, h.capacity(HostCapacity{MemReserve: 1 << 30, StoreReserve: 1 << 30}))
	ctx := as(admin)
	_, err := e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "big", MemBytes: ptr[int64](4 << 30)})
	wantCapacityError(t, err, "mem_bytes 4.0 GiB")
	if all := e.all(t); len(all) != 0 {
		t.Fatalf("a refused create left %d records", len(all))
	}
	e.create(t, admin, "fits") // the default 1 GiB fits in 3 GiB less 1 GiB

	h.store.Store(512 << 20)
	_, err = e.m.CreateSandbox(ctx, protocol.CreateSandboxRequest{Name: "nospace"})
	wantCapacityError(t, err, "below its 1.0 GiB reserve")
	if _, err := e.m.StopSandbox(ctx, "fits"); err != nil {
		t.Fatal(err)
	}
	_, err = e.m.StartSandbox(ctx, "fits")
	wantCapacityError(t, err, "the store has 512 MiB usable")
	if sb := e.get(t, e.all(t)[0].ID); sb.Status != protocol.StatusStopped {
		t.Fatalf("a refused start left the sandbox %s", sb.Status)
	}
}

// holdStarts makes the fake driver's starts wait until release is closed,
// counting how many wait at once.
type holdStarts struct {
	release      chan struct{}
	mu           sync.Mutex
	now, maxSeen int
}

func (h *holdStarts) hook(ctx context.Context, _ runtime.Spec) error {
	h.mu.Lock()
	h.now++
	h.maxSeen = max(h.maxSeen, h.now)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.now--
		h.mu.Unlock()
	}()
	select {
	case <-h.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *holdStarts) running() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now
}

// With 2 boot slots and a queue of 3, five creates at once are admitted —
// two boot, three wait — a sixth is refused with a CapacityError and no
// record, and once the starts go on all five are ready; no more than two
// ever started at once.
func TestBootSlotsAndQueue(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Capacity = HostCapacity{MaxBoots: 2, BootQueue: 3} })
	h := &holdStarts{release: make(chan struct{})}
	e.driver.StartHook = h.hook
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := e.m.CreateSandbox(as(admin), protocol.CreateSandboxRequest{})
			if err == nil && sb.Status != protocol.StatusReady {
				err = errors.New("status " + sb.Status)
			}
			errs[i] = err
		}()
	}
	eventually(t, "two starts running, five records", func() bool { return h.running() == 2 && len(e.all(t)) == 5 })
	_, err := e.m.CreateSandbox(as(admin), protocol.CreateSandboxRequest{Name: "sixth"})
	wantCapacityError(t, err, "5 boots running or waiting (at most 2 at once, 3 waiting)")
	time.Sleep(50 * time.Millisecond) // the waiting boots stay waiting
	if n := h.running(); n != 2 {
		t.Fatalf("%d starts at once with 2 boot slots", n)
	}
	close(h.release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("create %d: %v", i, err)
		}
	}
	if h.maxSeen != 2 {
		t.Errorf("at most %d starts ran at once, want 2", h.maxSeen)
	}
	e.create(t, admin, "after") // the queue has drained
}

// A warm pool is not refilled while the host lacks the memory for an
// instance; once it has it, the pool fills.
func TestPoolRefillStopsPastHostMemory(t *testing.T) {
	h := &fakeHost{}
	h.mem.Store(1 << 30) // the reserve takes it all
	h.store.Store(10 << 30)
	e := newEnv(t, h.capacity(HostCapacity{MemReserve: 1 << 30}))
	if _, err := e.m.SetPool(as(admin), e.snap.ID, 2, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.m.StartPools(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * poolRefillTick)
	if n := len(e.readyPool()); n != 0 || e.driver.Instances() != 0 {
		t.Fatalf("refilled %d instances (%d running) without the memory", n, e.driver.Instances())
	}
	h.mem.Store(8 << 30)
	eventually(t, "pool full", func() bool { return len(e.readyPool()) == 2 })
}

func TestParseMemAvailable(t *testing.T) {
	got, err := parseMemAvailable(strings.NewReader("MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20480000 kB\n"))
	if err != nil || got != 20480000<<10 {
		t.Fatalf("got %d, %v", got, err)
	}
	if _, err := parseMemAvailable(strings.NewReader("MemTotal: 1 kB\n")); err == nil {
		t.Fatal("no MemAvailable line: no error")
	}
	if n, err := ReadMemAvailable(); err != nil || n <= 0 {
		t.Fatalf("this host's MemAvailable: %d, %v", n, err)
	}
}

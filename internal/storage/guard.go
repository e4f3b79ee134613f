package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
)

// capacityFile, in a sandbox's volume next to (not inside) its upper dir,
// holds the fs_capacity_bytes Limit was given: the ceiling the space guard
// restores once there is room again. The sandbox cannot see or change it.
const capacityFile = "capacity"

// SpaceGuard keeps the sandboxes' write limits inside what the CoW store
// can still take. Each sandbox volume's qgroup limit is its fs capacity
// while the store has room for every sandbox to fill its capacity; when it
// does not, the usable space above the reserve (the smaller of the store's
// and its host filesystem's free space, less the reserve) is shared out:
// each volume may grow by at most its share (smaller needs first, what
// they leave goes to the others). A sandbox past its share gets EDQUOT on
// its next write — an error it can handle — instead of the store running
// out of space and btrfs turning read-only under every sandbox.
//
// Qgroup counts lag the latest writes until the next transaction commit,
// which only makes the computed room smaller than the real one.
type SpaceGuard struct {
	o       *Overlays
	reserve int64
	log     *slog.Logger
	kick    chan struct{}

	mu      sync.Mutex       // serialises Step; guards applied, capped
	applied map[string]int64 // volume id -> limit last set
	capped  map[string]bool  // volume id -> limit below its capacity

	lastBalance time.Time // when TendMetadata last balanced; Run's goroutine only
}

// balanceEvery is the least time between two balances: one that did not
// help is not retried at once (a balance reads and rewrites chunks).
const balanceEvery = time.Minute

// TendMetadata balances the store (CoW.Rebalance) when its btrfs metadata
// has less than twice its reserve free, at most once per balanceEvery. It
// reports, as an error, a balance that leaves metadata under its reserve.
func (g *SpaceGuard) TendMetadata(ctx context.Context) error {
	sp, err := g.o.cow.Space()
	if err != nil || sp.Metadata == nil || sp.Metadata.Free >= 2*sp.Metadata.Reserve || time.Since(g.lastBalance) < balanceEvery {
		return err
	}
	g.lastBalance = time.Now()
	g.log.Warn("btrfs metadata low: balancing the store", "free", sp.Metadata.Free, "reserve", sp.Metadata.Reserve, "unallocated", sp.Metadata.Unallocated)
	_, after, err := g.o.cow.Rebalance(ctx)
	if after == nil {
		return err
	}
	if after.Free < after.Reserve {
		return errors.Join(fmt.Errorf("btrfs metadata still low after a balance: %d bytes free, reserve %d; free space in the store (delete sandboxes or snapshots)", after.Free, after.Reserve), err)
	}
	if err != nil {
		g.log.Info("store balanced; some stages failed", "err", err)
	}
	return nil
}

// Guard returns o's space guard, keeping reserve bytes usable. Nil when the
// store cannot enforce limits (no btrfs or no quotas).
func (o *Overlays) Guard(reserve int64, log *slog.Logger) *SpaceGuard {
	if !o.cow.btrfs() || !o.cow.quota {
		return nil
	}
	g := &SpaceGuard{o: o, reserve: reserve, log: log, kick: make(chan struct{}, 1), applied: map[string]int64{}, capped: map[string]bool{}}
	o.guard = g
	return g
}

// Run steps the guard every interval, and at once after a Limit, until ctx
// ends.
func (g *SpaceGuard) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := g.Step(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("space guard", "err", err)
		}
		if err := g.TendMetadata(ctx); err != nil && ctx.Err() == nil {
			g.log.Warn("space guard: btrfs metadata", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-g.kick:
		}
	}
}

// forget drops what the guard last set for id: Limit has just set its
// full capacity, so the next Step must set id's limit whatever it was.
func (g *SpaceGuard) forget(id string) {
	g.mu.Lock()
	delete(g.applied, id)
	delete(g.capped, id)
	g.mu.Unlock()
}

// poke asks Run for a step soon (a new capacity was set).
func (g *SpaceGuard) poke() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// guardedVolume is one sandbox volume the guard limits.
type guardedVolume struct {
	id         string
	path       string
	rfer, need int64
}

// Step measures the store and sets every guarded volume's limit.
func (g *SpaceGuard) Step(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	vols, err := g.volumes()
	if err != nil || len(vols) == 0 {
		return err
	}
	sp, err := g.o.cow.Space()
	if err != nil {
		return err
	}
	counts, err := qgroupCounts(g.o.cow.Root())
	if err != nil {
		return err
	}
	for i := range vols {
		id, err := btrfsRootID(vols[i].path)
		if err != nil {
			return fmt.Errorf("space guard: %w", err)
		}
		c := counts[id]
		vols[i].rfer = c.rfer
		vols[i].need = max(vols[i].need-c.rfer, 0) // need held the capacity
	}
	limits := shareRoom(vols, max(sp.Usable-g.reserve, 0))
	var errs []error
	for _, v := range vols {
		lim := limits[v.id]
		if g.applied[v.id] == lim {
			continue
		}
		if err := g.o.cow.setQgroupLimit(v.path, lim); err != nil {
			errs = append(errs, fmt.Errorf("limit volume %s to %d bytes: %w", v.id, lim, err))
			continue
		}
		capped := lim < v.rfer+v.need
		if prev, ok := g.applied[v.id]; !ok || capped != g.capped[v.id] {
			if capped {
				g.log.Warn("store low on space: sandbox writes capped below its fs capacity", "sandbox", v.id, "limit", lim, "used", v.rfer, "usable", sp.Usable)
			} else if ok && prev != lim {
				g.log.Info("store has room again: sandbox writes limited by its fs capacity only", "sandbox", v.id)
			}
		}
		g.applied[v.id], g.capped[v.id] = lim, capped
	}
	for id := range g.applied {
		if !slices.ContainsFunc(vols, func(v guardedVolume) bool { return v.id == id }) {
			delete(g.applied, id)
			delete(g.capped, id)
		}
	}
	return errors.Join(errs...)
}

// shareRoom gives each volume a limit of its referenced bytes plus what it
// may still grow by: its whole need when room covers every need, else an
// equal share of room, smallest needs first (what a volume does not need
// goes to the rest).
func shareRoom(vols []guardedVolume, room int64) map[string]int64 {
	order := slices.Clone(vols)
	slices.SortFunc(order, func(a, b guardedVolume) int {
		switch {
		case a.need < b.need:
			return -1
		case a.need > b.need:
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	out := make(map[string]int64, len(order))
	for i, v := range order {
		give := min(v.need, room/int64(len(order)-i))
		room -= give
		out[v.id] = v.rfer + give
	}
	return out
}

// volumes lists the sandbox volumes with a capacity file; need holds the
// capacity until Step subtracts what is used.
func (g *SpaceGuard) volumes() ([]guardedVolume, error) {
	dir := filepath.Join(g.o.cow.Root(), volSandboxes)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("space guard: %w", err)
	}
	var vols []guardedVolume
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(filepath.Join(path, capacityFile))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("space guard: %w", err)
		}
		capacity, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || capacity <= 0 {
			continue
		}
		vols = append(vols, guardedVolume{id: e.Name(), path: path, need: capacity})
	}
	return vols, nil
}

// writeCapacity records id's capacity for the guard.
func writeCapacity(vol string, bytes int64) error {
	return atomicfile.WriteFile(filepath.Join(vol, capacityFile), []byte(strconv.FormatInt(bytes, 10)+"\n"), 0o600)
}

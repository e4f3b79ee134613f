package microvm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// Each QEMU is root of a user namespace whose ids (0..userns.IDMapSize-1)
// are a host range of its own, so two QEMUs a guest broke out of are never
// the same host user (signals, ptrace, /proc, per-user limits). The range
// of slot n is slotIDBase + n*IDMapSize: above what the namespace runtime
// uses (userns.HostIDBase.. and its owner uids 1100000–1199999), maxSlots
// of them (host ids 2000000 to 270435455).
//
// A slot is the file slotsDir/<n> in the state dir, holding its owner (a
// sandbox id, or the KVM probe's temporary dir name): it is taken by hard-linking a file already
// holding the owner to that name, which fails when it exists, so
// concurrent allocations (even by two daemons on one state dir) never share
// one, and the owner is never missing from a taken slot. It lives as long
// as the state dir: a daemon that restarts (kill -9 included) finds its
// running VMs' slots taken still; Stop frees them once QEMU is dead.
const (
	slotIDBase = 2_000_000
	maxSlots   = 4096
	// slotsDir is in the state dir; its leading dot keeps it off the
	// sandbox ids List returns.
	slotsDir = ".id-slots"
)

// slotHostID is the host uid and gid of root in slot's range.
func slotHostID(slot int) int { return slotIDBase + slot*userns.IDMapSize }

// allocSlot takes the lowest free slot of stateDir for owner.
func allocSlot(stateDir, owner string) (int, error) {
	dir := filepath.Join(stateDir, slotsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("id slots: %w", err)
	}
	f, err := os.CreateTemp(dir, ".new-")
	if err != nil {
		return 0, fmt.Errorf("id slots: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.WriteString(owner)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("id slots: %w", err)
	}
	for n := 0; n < maxSlots; n++ {
		err := os.Link(tmp, filepath.Join(dir, strconv.Itoa(n)))
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("id slots: %w", err)
		}
	}
	return 0, fmt.Errorf("id slots: all %d taken", maxSlots)
}

// releaseSlots frees every slot of stateDir owned by owner.
func releaseSlots(stateDir, owner string) error {
	dir := filepath.Join(stateDir, slotsDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("id slots: %w", err)
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("id slots: %w", err)
		}
		if string(b) == owner {
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("id slots: free %s: %w", e.Name(), err)
			}
		}
	}
	return nil
}

package network

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/vishvananda/netlink"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"golang.org/x/sys/unix"
)

// record is the persisted allocation of one sandbox: <StateDir>/<id>.json.
// It is written once, atomically, and removed by Teardown.
type record struct {
	ID        string     `json:"id"`
	Index     int        `json:"index"` // which /30 of the pool
	HostIf    string     `json:"host_if"`
	HostIP    netip.Addr `json:"host_ip"`
	SandboxIP netip.Addr `json:"sandbox_ip"`
	PrefixLen int        `json:"prefix_len"`
}

const recordExt = ".json"

// hostIfName derives the host-side veth name from the id: "cb" + 10 hex
// digits of sha256(id), 12 characters, within IFNAMSIZ-1.
func hostIfName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return HostIfPrefix + hex.EncodeToString(sum[:5])
}

func (m *Manager) recordPath(id string) string {
	return filepath.Join(m.stateDir, id+recordExt)
}

func (m *Manager) netnsPath(id string) string { return filepath.Join(m.netnsDir, id) }

// subnets is how many /30s fit in the pool.
func (m *Manager) subnets() int { return 1 << (30 - m.pool.Bits()) }

// subnet returns the host and sandbox addresses of the index-th /30.
func (m *Manager) subnet(index int) (host, sandbox netip.Addr) {
	b := m.pool.Addr().As4()
	base := binary.BigEndian.Uint32(b[:]) + uint32(index)*4
	var h, s [4]byte
	binary.BigEndian.PutUint32(h[:], base+1)
	binary.BigEndian.PutUint32(s[:], base+2)
	return netip.AddrFrom4(h), netip.AddrFrom4(s)
}

// hostLockName is the file beside the netns directory (host-wide for every
// daemon: /run/cubicle/alloc.lock) that Setup flocks from allocating an address
// until the address is on the host. allocate skips addresses already on
// the host, so two daemons sharing a pool never pick the same /30 (they
// did: parallel daemons raced, and one's agent token reached the other's
// sandbox, which answered 401).
const hostLockName = "alloc.lock"

// lockHost takes the host-wide allocation lock; the returned func
// releases it.
func (m *Manager) lockHost() (func(), error) {
	f, err := os.OpenFile(filepath.Join(filepath.Dir(m.netnsDir), hostLockName), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open host allocation lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("take host allocation lock: %w", err)
	}
	return func() { f.Close() }, nil // closing the descriptor releases the lock
}

// allocate picks the lowest free /30 for id and persists the record. The
// caller holds id's lock and has checked that id has no record.
func (m *Manager) allocate(id string) (*record, error) {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	recs, err := m.readRecords()
	if err != nil {
		return nil, err
	}
	used := make(map[int]bool, len(recs))
	ifName := hostIfName(id)
	for _, r := range recs {
		used[r.Index] = true
		if r.HostIf == ifName {
			return nil, fmt.Errorf("interface name %s of %s already used by %s: %w", ifName, id, r.ID, errdefs.ErrConflict)
		}
	}
	// Addresses already on the host (another daemon on the same pool, a
	// leftover link) are taken too: reusing one would misroute traffic.
	onHost, err := hostAddrs()
	if err != nil {
		return nil, err
	}
	index := -1
	for i := range m.subnets() {
		if host, _ := m.subnet(i); !used[i] && !onHost[host] {
			index = i
			break
		}
	}
	if index < 0 {
		return nil, fmt.Errorf("pool %s exhausted: %w", m.pool, errdefs.ErrUnavailable)
	}
	host, sandbox := m.subnet(index)
	rec := &record{ID: id, Index: index, HostIf: ifName, HostIP: host, SandboxIP: sandbox, PrefixLen: 30}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode record: %w", err)
	}
	if err := atomicfile.WriteFile(m.recordPath(id), data, 0o600); err != nil {
		return nil, fmt.Errorf("write record: %w", err)
	}
	return rec, nil
}

// readRecord loads id's record; errdefs.ErrNotFound if there is none.
func (m *Manager) readRecord(id string) (*record, error) {
	data, err := os.ReadFile(m.recordPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("allocation for %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read allocation: %w", err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode allocation %s: %w", m.recordPath(id), err)
	}
	if r.ID != id || !r.HostIP.Is4() || !r.SandboxIP.Is4() || r.HostIf == "" {
		return nil, fmt.Errorf("allocation %s is inconsistent: %w", m.recordPath(id), errdefs.ErrInvalid)
	}
	return &r, nil
}

// readRecords loads every record in StateDir.
func (m *Manager) readRecords() ([]*record, error) {
	ents, err := os.ReadDir(m.stateDir)
	if err != nil {
		return nil, fmt.Errorf("read state dir: %w", err)
	}
	var recs []*record
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasSuffix(name, recordExt) || strings.HasPrefix(name, ".") {
			continue
		}
		id := strings.TrimSuffix(name, recordExt)
		if validID(id) != nil {
			continue
		}
		r, err := m.readRecord(id)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // removed concurrently
		}
		if err != nil {
			return nil, err
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// removeRecord deletes id's record; a missing record is not an error.
func (m *Manager) removeRecord(id string) error {
	if err := os.Remove(m.recordPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove allocation: %w", err)
	}
	return atomicfile.SyncDir(m.stateDir)
}

// hostAddrs returns every IPv4 address assigned in the host's namespace.
func hostAddrs() (map[netip.Addr]bool, error) {
	addrs, err := consistentDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list host addresses: %w", err)
	}
	out := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out[ip] = true
		}
	}
	return out, nil
}

// dumpAttempts bounds consistentDump's retries.
const dumpAttempts = 10

// consistentDump runs a netlink dump until the kernel reports it
// consistent. A dump that races a change (other sandboxes' links coming
// and going) ends with ErrDumpInterrupted and possibly partial results:
// allocating from those could hand out an address in use.
func consistentDump[T any](dump func() (T, error)) (T, error) {
	var out T
	var err error
	for range dumpAttempts {
		if out, err = dump(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			return out, err
		}
	}
	return out, fmt.Errorf("%d dumps in a row interrupted by changes: %w", dumpAttempts, err)
}

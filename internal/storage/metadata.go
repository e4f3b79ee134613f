package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// btrfs metadata.
//
// btrfs keeps file data and metadata (inodes, directories, small inline
// files, checksums, qgroup and snapshot bookkeeping) in separate chunks
// carved from the device's unallocated space. A btrfs whose metadata
// chunks are full and whose device has nothing left unallocated aborts its
// next transaction and turns read-only, although statfs still shows free
// data space: data chunks took the device. So metadata is accounted apart
// from data: what metadata can still take is the free part of its chunks,
// less the kernel's global reserve, plus the unallocated space a new
// metadata chunk could use. Under the reserve (MetadataReserve) the health
// check fails; under twice the reserve the space guard balances: data
// chunks emptied by deletions are compacted and their device space given
// back, so metadata can grow again.

// Block group flags of struct btrfs_ioctl_space_info.
const (
	bgData       = 1 << 0
	bgMetadata   = 1 << 2
	bgRAID1      = 1 << 4
	bgDUP        = 1 << 5
	bgRAID10     = 1 << 6
	bgRAID1C3    = 1 << 9
	bgRAID1C4    = 1 << 10
	spaceGlobalR = 1 << 49 // BTRFS_SPACE_INFO_GLOBAL_RSV
)

// btrfs ioctls (magic 0x94): SPACE_INFO is _IOWR(20, 16-byte header),
// DEV_INFO _IOWR(30, 4096 bytes), FS_INFO _IOR(31, 1024 bytes).
const (
	iocSpaceInfo = 0xc0109414
	iocDevInfo   = 0xd000941e
	iocFSInfo    = 0x8400941f
)

// btrfsSpaceInfo is one struct btrfs_ioctl_space_info.
type btrfsSpaceInfo struct {
	flags, total, used uint64
}

// MetadataReserve is the metadata space kept free on a store of total
// bytes: 1/64 of it, at least 16 MiB (a few transactions' worth) and at
// most 512 MiB.
func MetadataReserve(total int64) int64 {
	return min(max(total/64, 16<<20), 512<<20)
}

// metadataSpace reads the metadata space of the btrfs at path, whose size
// is total bytes (its reserve follows from it).
func metadataSpace(path string, total int64) (*protocol.MetadataSpace, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("btrfs metadata of %s: %w", path, err)
	}
	defer unix.Close(fd)
	infos, err := btrfsSpaceInfos(fd)
	if err != nil {
		return nil, fmt.Errorf("btrfs metadata of %s: space info: %w", path, err)
	}
	unalloc, err := btrfsUnallocated(fd)
	if err != nil {
		return nil, fmt.Errorf("btrfs metadata of %s: device info: %w", path, err)
	}
	m := metadataOf(infos, unalloc)
	m.Reserve = MetadataReserve(total)
	return m, nil
}

// metadataOf sums the metadata space infos and works out what metadata
// can still take, given the device's unallocated bytes.
func metadataOf(infos []btrfsSpaceInfo, unalloc int64) *protocol.MetadataSpace {
	var m protocol.MetadataSpace
	var reserve int64
	copies := int64(1)
	for _, in := range infos {
		switch {
		case in.flags&spaceGlobalR != 0:
			reserve = int64(in.total)
		case in.flags&bgMetadata != 0 && in.flags&bgData == 0: // mixed block groups count as data
			m.Total += int64(in.total)
			m.Used += int64(in.used)
			copies = max(copies, profileCopies(in.flags))
		}
	}
	m.Unallocated = unalloc
	m.Free = max(m.Total-m.Used-reserve+unalloc/copies, 0)
	return &m
}

// profileCopies is how many device bytes one byte of a block group with
// flags takes.
func profileCopies(flags uint64) int64 {
	switch {
	case flags&bgRAID1C4 != 0:
		return 4
	case flags&bgRAID1C3 != 0:
		return 3
	case flags&(bgDUP|bgRAID1|bgRAID10) != 0:
		return 2
	}
	return 1
}

// btrfsSpaceInfos is BTRFS_IOC_SPACE_INFO: asked once for the count, then
// for the infos.
func btrfsSpaceInfos(fd int) ([]btrfsSpaceInfo, error) {
	var hdr [2]uint64 // space_slots, total_spaces
	if err := ioctl(fd, iocSpaceInfo, unsafe.Pointer(&hdr[0])); err != nil {
		return nil, err
	}
	n := hdr[1]
	buf := make([]uint64, 2+3*n)
	buf[0] = n
	if err := ioctl(fd, iocSpaceInfo, unsafe.Pointer(&buf[0])); err != nil {
		return nil, err
	}
	n = min(n, buf[1])
	out := make([]btrfsSpaceInfo, n)
	for i := range out {
		out[i] = btrfsSpaceInfo{flags: buf[2+3*i], total: buf[3+3*i], used: buf[4+3*i]}
	}
	return out, nil
}

// btrfsUnallocated is the device bytes no chunk holds, summed over the
// filesystem's devices (BTRFS_IOC_FS_INFO, then BTRFS_IOC_DEV_INFO per
// device id).
func btrfsUnallocated(fd int) (int64, error) {
	var fsInfo [1024]byte
	if err := ioctl(fd, iocFSInfo, unsafe.Pointer(&fsInfo[0])); err != nil {
		return 0, err
	}
	maxID := binary.LittleEndian.Uint64(fsInfo[0:])
	var total int64
	for id := uint64(1); id <= maxID; id++ {
		var dev [4096]byte
		binary.LittleEndian.PutUint64(dev[0:], id)
		if err := ioctl(fd, iocDevInfo, unsafe.Pointer(&dev[0])); err != nil {
			if err == unix.ENODEV {
				continue // a removed device's id
			}
			return 0, err
		}
		used, size := binary.LittleEndian.Uint64(dev[24:]), binary.LittleEndian.Uint64(dev[32:])
		total += int64(size) - int64(used)
	}
	return total, nil
}

// metadata is metadataSpace of the store.
func (c *CoW) metadata() (*protocol.MetadataSpace, error) {
	st, err := statFS(c.root)
	if err != nil {
		return nil, err
	}
	return metadataSpace(c.root, st.Total)
}

// balanceUsages are the data balances Rebalance runs, in order, until
// metadata is out of the low zone: chunks used under each percentage are
// compacted into others and the device space they held given back, so a
// new metadata chunk can take it. 0 only drops empty chunks (no
// relocation, so it works on a full device). Metadata chunks are not
// balanced (-musage): compacting them turns free metadata space into
// unallocated space at half the rate under DUP, which leaves metadata less
// room, not more.
var balanceUsages = []int{0, 50, 90}

// Rebalance compacts the store's data chunks (btrfs balance start
// -dusage=N, balanceUsages) until metadata has twice its reserve free or
// the stages run out. It returns the metadata space before and after, and
// the stages that failed (one can fail for want of room and the next
// still help).
func (c *CoW) Rebalance(ctx context.Context) (before, after *protocol.MetadataSpace, err error) {
	if !c.btrfs() {
		return nil, nil, nil
	}
	if before, err = c.metadata(); err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	after = before
	var errs []error
	for _, u := range balanceUsages {
		if after.Free >= 2*after.Reserve {
			break
		}
		if _, err := btrfsCmd(ctx, "balance", "start", fmt.Sprintf("-dusage=%d", u), c.root); err != nil {
			errs = append(errs, fmt.Errorf("balance the store (-dusage=%d): %w", u, err))
		}
		if after, err = c.metadata(); err != nil {
			return before, nil, err
		}
	}
	c.log.Info("store balanced", "took", time.Since(t0), "metadata_free_before", before.Free, "metadata_free_after", after.Free, "failed_stages", len(errs))
	return before, after, errors.Join(errs...)
}

package storage

import (
	"context"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfsIocQgroupLimit is BTRFS_IOC_QGROUP_LIMIT:
// _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args).
const btrfsIocQgroupLimit = 0x8030942b

// btrfsQgroupLimitMaxRfer is BTRFS_QGROUP_LIMIT_MAX_RFER.
const btrfsQgroupLimitMaxRfer = 1 << 0

// btrfsQgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args (48 bytes):
// a qgroup id (0: the subvolume the ioctl's fd is in) and its limits.
type btrfsQgroupLimitArgs struct {
	qgroupid uint64
	flags    uint64
	maxRfer  uint64
	maxExcl  uint64
	rsvRfer  uint64
	rsvExcl  uint64
}

// Limit caps what sandbox id may write (its upper dir) at bytes, so
// fs_capacity_bytes is enforced rather than recorded: a write past it
// fails with EDQUOT inside the sandbox. It sets the btrfs qgroup limit of
// the sandbox's subvolume (quotas are enabled on the CoW store); on the copy
// backend, or for a sandbox from before the CoW store, it reports
// enforced=false and does nothing. With a space guard (Guard), the
// capacity is also recorded for it, and it may lower the limit while the
// store is short of space.
func (o *Overlays) Limit(ctx context.Context, id string, bytes int64) (enforced bool, err error) {
	vol := o.volume(id)
	if !o.cow.btrfs() || !isSubvolume(vol) || bytes <= 0 {
		return false, nil
	}
	if err := o.cow.setQgroupLimit(vol, bytes); err != nil {
		return false, fmt.Errorf("limit volume of %s to %d bytes: %w", id, bytes, err)
	}
	if o.guard != nil {
		if err := writeCapacity(vol, bytes); err != nil {
			return false, fmt.Errorf("record capacity of %s: %w", id, err)
		}
		o.guard.forget(id)
		o.guard.poke()
	}
	return true, nil
}

// setQgroupLimit sets the referenced-bytes limit of the subvolume at vol.
// The ioctl goes through the store's root, naming the subvolume's qgroup:
// through the subvolume itself, its transaction would reserve metadata
// against that very qgroup and fail with EDQUOT once the subvolume is at
// its limit — exactly when the space guard must raise it again.
func (c *CoW) setQgroupLimit(vol string, bytes int64) error {
	id, err := btrfsRootID(vol)
	if err != nil {
		return err
	}
	fd, err := unix.Open(c.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	args := btrfsQgroupLimitArgs{qgroupid: id, flags: btrfsQgroupLimitMaxRfer, maxRfer: uint64(bytes)}
	return ioctl(fd, btrfsIocQgroupLimit, unsafe.Pointer(&args))
}

// The kernel's struct is 48 bytes; these fail to compile otherwise.
var (
	_ [48 - unsafe.Sizeof(btrfsQgroupLimitArgs{})]byte
	_ [unsafe.Sizeof(btrfsQgroupLimitArgs{}) - 48]byte
)

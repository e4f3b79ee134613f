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
// enforced=false and does nothing.
func (o *Overlays) Limit(ctx context.Context, id string, bytes int64) (enforced bool, err error) {
	vol := o.volume(id)
	if !o.cow.btrfs() || !isSubvolume(vol) || bytes <= 0 {
		return false, nil
	}
	fd, err := unix.Open(vol, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("limit volume of %s: %w", id, err)
	}
	defer unix.Close(fd)
	args := btrfsQgroupLimitArgs{flags: btrfsQgroupLimitMaxRfer, maxRfer: uint64(bytes)}
	if err := ioctl(fd, btrfsIocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return false, fmt.Errorf("limit volume of %s to %d bytes: %w", id, bytes, err)
	}
	return true, nil
}

// The kernel's struct is 48 bytes; these fail to compile otherwise.
var (
	_ [48 - unsafe.Sizeof(btrfsQgroupLimitArgs{})]byte
	_ [unsafe.Sizeof(btrfsQgroupLimitArgs{}) - 48]byte
)

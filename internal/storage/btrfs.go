package storage

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Btrfs ioctls, from linux/btrfs.h. Calling them directly instead of
// running btrfs(8) keeps a snapshot at a few milliseconds: most of the
// cost of `btrfs subvolume snapshot` is starting the process.
const (
	btrfsIocSnapDestroy    = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocInoLookup      = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	btrfsIocSnapCreateV2   = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	btrfsIocSubvolCreateV2 = 0x50009418 // _IOW(0x94, 24, struct btrfs_ioctl_vol_args_v2)
	btrfsSubvolRdonly      = 1 << 1
	btrfsFirstFreeObjectID = 256 // inode number of every subvolume's root
)

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes).
type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	unused  [4]uint64
	name    [4040]byte
}

// btrfsVolArgs is struct btrfs_ioctl_vol_args (4096 bytes).
type btrfsVolArgs struct {
	fd   int64
	name [4088]byte
}

// btrfsInoLookupArgs is struct btrfs_ioctl_ino_lookup_args (4096 bytes).
type btrfsInoLookupArgs struct {
	treeid   uint64
	objectid uint64
	name     [4080]byte
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// openDir opens path's parent directory and returns it with path's base
// name, the form every btrfs create/destroy ioctl takes.
func openParent(path string) (int, string, error) {
	name := filepath.Base(path)
	if len(name) >= 4040 {
		return -1, "", fmt.Errorf("name of %s too long", path)
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", fmt.Errorf("open %s: %w", filepath.Dir(path), err)
	}
	return fd, name, nil
}

// btrfsSubvolCreate creates an empty subvolume at path.
func btrfsSubvolCreate(path string) error {
	dfd, name, err := openParent(path)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var args btrfsVolArgsV2
	copy(args.name[:], name)
	if err := ioctl(dfd, btrfsIocSubvolCreateV2, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	return nil
}

// btrfsSnapshot snapshots subvolume src at dst, read-only when readonly.
func btrfsSnapshot(src, dst string, readonly bool) error {
	sfd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", src, err)
	}
	defer unix.Close(sfd)
	dfd, name, err := openParent(dst)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	args := btrfsVolArgsV2{fd: int64(sfd)}
	if readonly {
		args.flags = btrfsSubvolRdonly
	}
	copy(args.name[:], name)
	if err := ioctl(dfd, btrfsIocSnapCreateV2, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
	}
	return nil
}

// btrfsSubvolDelete deletes the subvolume at path (read-only or not, empty
// or not). Its space is reclaimed in the background by the kernel.
func btrfsSubvolDelete(path string) error {
	dfd, name, err := openParent(path)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	var args btrfsVolArgs
	copy(args.name[:], name)
	if err := ioctl(dfd, btrfsIocSnapDestroy, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("delete subvolume %s: %w", path, err)
	}
	return nil
}

// isSubvolume reports whether path is the root of a btrfs subvolume.
func isSubvolume(path string) bool {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Ino != btrfsFirstFreeObjectID {
		return false
	}
	return isBtrfs(path)
}

// btrfsRootID returns the id of the subvolume containing path.
func btrfsRootID(path string) (uint64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	args := btrfsInoLookupArgs{objectid: btrfsFirstFreeObjectID}
	if err := ioctl(fd, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return 0, fmt.Errorf("look up subvolume id of %s: %w", path, err)
	}
	return args.treeid, nil
}

// isBtrfs reports whether path is on a btrfs filesystem.
func isBtrfs(path string) bool {
	var fs unix.Statfs_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.BTRFS_SUPER_MAGIC
}

// btrfsCmd runs btrfs(8) for the rare operations without a simple ioctl
// (quota setup and reports).
func btrfsCmd(ctx context.Context, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, "btrfs", args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("btrfs %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// qgroupExclusive returns the exclusive bytes of every level-0 qgroup (one
// per subvolume) of the filesystem at root, keyed by subvolume id, as of
// its last transaction commit.
func qgroupExclusive(root string) (map[uint64]int64, error) {
	counts, err := qgroupCounts(root)
	if err != nil {
		return nil, err
	}
	res := make(map[uint64]int64, len(counts))
	for id, c := range counts {
		res[id] = c.excl
	}
	return res, nil
}

// qgroupCount is one level-0 qgroup's referenced and exclusive bytes.
type qgroupCount struct{ rfer, excl int64 }

// Quota tree items (ctree.h): the tree's id, and the key type of a
// qgroup's info item, keyed (0, btrfsQgroupInfoKey, qgroupid).
const (
	btrfsQuotaTreeID   = 8
	btrfsQgroupInfoKey = 242
	// btrfsQgroupInfoSize is struct btrfs_qgroup_info_item: generation,
	// rfer, rfer_cmpr, excl, excl_cmpr (u64 each).
	btrfsQgroupInfoSize = 40
)

// qgroupCounts returns the counts of every level-0 qgroup of the
// filesystem at root as of its last transaction commit, read from the
// quota tree with one search ioctl (no `btrfs qgroup show` process, no
// sync: a reader never waits for other volumes' writes).
func qgroupCounts(root string) (map[uint64]qgroupCount, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(fd)
	args := new(btrfsSearchArgsV2)
	k := &args.key
	k.treeID = btrfsQuotaTreeID
	k.minType, k.maxType = btrfsQgroupInfoKey, btrfsQgroupInfoKey
	// Level-0 qgroup ids are the subvolume ids (level 0 in the top 16 bits).
	k.maxOffset = 1<<48 - 1
	k.maxTransid = ^uint64(0)
	res := map[uint64]qgroupCount{}
	for {
		k.nrItems = 4096
		args.bufSize = searchBufSize
		if err := ioctl(fd, btrfsIocTreeSearchV2, unsafe.Pointer(args)); err != nil {
			return nil, fmt.Errorf("search the quota tree of %s: %w", root, err)
		}
		if k.nrItems == 0 {
			return res, nil
		}
		var offset uint64
		buf := args.buf[:]
		for i := uint32(0); i < k.nrItems && len(buf) >= searchHeaderSize; i++ {
			offset = le64(buf[16:])
			typ, n := le32(buf[24:]), int(le32(buf[28:]))
			item := buf[searchHeaderSize:]
			if n > len(item) {
				return nil, fmt.Errorf("search the quota tree of %s: item of %d bytes past the buffer", root, n)
			}
			item, buf = item[:n], item[n:]
			if typ == btrfsQgroupInfoKey && n >= btrfsQgroupInfoSize {
				res[offset] = qgroupCount{rfer: int64(le64(item[8:])), excl: int64(le64(item[24:]))}
			}
		}
		if offset >= k.maxOffset {
			return res, nil
		}
		k.minOffset = offset + 1
	}
}

// haveBtrfsTools reports whether the btrfs kernel module and the user
// space tools needed for a loop-mounted store are present.
func haveBtrfsTools() bool {
	fs, err := os.ReadFile("/proc/filesystems")
	if err != nil || !bytes.Contains(fs, []byte("\tbtrfs\n")) {
		// The module may still autoload on mount; let mount decide.
		if _, err := os.Stat("/lib/modules"); err != nil {
			return false
		}
	}
	for _, bin := range []string{"mkfs.btrfs", "btrfs"} {
		if _, err := exec.LookPath(bin); err != nil {
			return false
		}
	}
	return true
}

// Btrfs ioctls and on-disk layouts the change tracker reads (tracker.go).
const (
	btrfsIocTreeSearchV2 = 0xc0709411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args_v2)
	btrfsIocWaitSync     = 0x40089416 // _IOW(0x94, 22, __u64)
	btrfsIocStartSync    = 0x80089418 // _IOR(0x94, 24, __u64)

	btrfsInodeItemKey  = 1
	btrfsInodeRefKey   = 12
	btrfsExtentDataKey = 108 // a file's data extent; generation at offset 0
	// btrfsInodeItemSize is sizeof(struct btrfs_inode_item); transid is
	// at offset 8, mode at 52.
	btrfsInodeItemSize = 160
	searchHeaderSize   = 32 // struct btrfs_ioctl_search_header
	searchBufSize      = 256 << 10
)

// btrfsSearchKey is struct btrfs_ioctl_search_key (104 bytes).
type btrfsSearchKey struct {
	treeID, minObjectID, maxObjectID uint64
	minOffset, maxOffset             uint64
	minTransid, maxTransid           uint64
	minType, maxType, nrItems        uint32
	_                                uint32
	_                                [4]uint64
}

// btrfsSearchArgsV2 is struct btrfs_ioctl_search_args_v2 with its buffer.
type btrfsSearchArgsV2 struct {
	key     btrfsSearchKey
	bufSize uint64
	buf     [searchBufSize]byte
}

// btrfsCommit writes dirty data back, commits the filesystem's running
// transaction (if any) and returns the id of the last committed one:
// afterwards every inode item and data extent of the subvolume fd is in,
// changed up to then, carries a transid at most that. The writeback costs
// what is dirty (nothing for a command that wrote nothing).
func btrfsCommit(fd int) (uint64, error) {
	// Written data still in the page cache (an append, an overwrite in
	// place) reaches the tree only at writeback, which a transaction
	// commit does not force: syncfs writes it back first.
	if err := unix.Syncfs(fd); err != nil {
		return 0, fmt.Errorf("sync btrfs before a commit: %w", err)
	}
	var transid uint64
	if err := ioctl(fd, btrfsIocStartSync, unsafe.Pointer(&transid)); err != nil {
		return 0, fmt.Errorf("start btrfs commit: %w", err)
	}
	if err := ioctl(fd, btrfsIocWaitSync, unsafe.Pointer(&transid)); err != nil {
		return 0, fmt.Errorf("wait for btrfs commit %d: %w", transid, err)
	}
	return transid, nil
}

// changedInode is an inode of a subvolume whose item changed.
type changedInode struct {
	ino  uint64
	mode uint32
	// refs are its names found next to it: parent directory inode and name.
	refs []inodeRef
}

type inodeRef struct {
	parent uint64
	name   string
}

// btrfsChangedInodes lists the inodes of subvolume fd whose item has a
// transid in (after, upto]. The kernel only visits tree blocks written
// after `after`, so the cost follows what changed, not the subvolume's
// size; nothing changed is one ioctl that finds no block.
func btrfsChangedInodes(fd int, after, upto uint64) ([]changedInode, error) {
	args := new(btrfsSearchArgsV2)
	k := &args.key
	k.maxObjectID, k.maxOffset, k.maxType = ^uint64(0), ^uint64(0), ^uint32(0)
	k.minTransid, k.maxTransid = after+1, ^uint64(0)
	byIno := map[uint64]*changedInode{}
	var order []uint64
	refs := map[uint64][]inodeRef{}
	for {
		k.nrItems = 4096
		args.bufSize = searchBufSize
		if err := ioctl(fd, btrfsIocTreeSearchV2, unsafe.Pointer(args)); err != nil {
			return nil, fmt.Errorf("search btrfs tree: %w", err)
		}
		if k.nrItems == 0 {
			break
		}
		var objectid, offset uint64
		var typ uint32
		buf := args.buf[:]
		for i := uint32(0); i < k.nrItems && len(buf) >= searchHeaderSize; i++ {
			objectid = le64(buf[8:])
			offset = le64(buf[16:])
			typ = le32(buf[24:])
			n := int(le32(buf[28:]))
			item := buf[searchHeaderSize:]
			if n > len(item) {
				return nil, fmt.Errorf("search btrfs tree: item of %d bytes past the buffer", n)
			}
			item, buf = item[:n], item[n:]
			switch typ {
			case btrfsInodeItemKey:
				if n < btrfsInodeItemSize {
					continue
				}
				if t := le64(item[8:]); t > after && t <= upto {
					if _, seen := byIno[objectid]; !seen {
						order = append(order, objectid)
					}
					byIno[objectid] = &changedInode{ino: objectid, mode: le32(item[52:])}
				}
			case btrfsExtentDataKey:
				// Data written into an existing file (an append, an
				// overwrite) gives it a new extent without always
				// moving its inode item's transid.
				if _, seen := byIno[objectid]; !seen && n >= 8 {
					if g := le64(item); g > after && g <= upto {
						byIno[objectid] = &changedInode{ino: objectid, mode: unix.S_IFREG}
						order = append(order, objectid)
					}
				}
			case btrfsInodeRefKey:
				// A list of {index u64, name_len u16, name}.
				for len(item) >= 10 {
					l := int(binary.LittleEndian.Uint16(item[8:]))
					if 10+l > len(item) {
						break
					}
					refs[objectid] = append(refs[objectid], inodeRef{parent: offset, name: string(item[10 : 10+l])})
					item = item[10+l:]
				}
			}
		}
		// Continue after the last key returned.
		k.minObjectID, k.minType, k.minOffset = objectid, typ, offset+1
		if offset == ^uint64(0) {
			k.minOffset, k.minType = 0, typ+1
			if typ == ^uint32(0) {
				k.minType, k.minObjectID = 0, objectid+1
			}
		}
		if objectid == ^uint64(0) && k.minObjectID == 0 {
			break
		}
	}
	out := make([]changedInode, 0, len(order))
	for _, ino := range order {
		c := byIno[ino]
		c.refs = refs[ino]
		out = append(out, *c)
	}
	return out, nil
}

// btrfsInoPath is the path of inode ino relative to the root of subvolume
// fd, with a trailing slash ("" for the root).
func btrfsInoPath(fd int, ino uint64) (string, error) {
	if ino == btrfsFirstFreeObjectID {
		return "", nil
	}
	args := btrfsInoLookupArgs{objectid: ino}
	if err := ioctl(fd, btrfsIocInoLookup, unsafe.Pointer(&args)); err != nil {
		return "", fmt.Errorf("look up path of inode %d: %w", ino, err)
	}
	n := bytes.IndexByte(args.name[:], 0)
	if n < 0 {
		n = len(args.name)
	}
	return string(args.name[:n]), nil
}

func le64(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// Package userns is what the drivers that run host processes in user
// namespaces share (the namespace driver's sandbox init, the microvm
// driver's QEMU): the sandbox id mapping, a namespace of it to idmap mounts
// with, idmapped detached mounts of the rootfs and bind sources, and fresh
// detached filesystems attached from inside.
//
// Ids: root of such a namespace is a host uid/gid base (HostIDBase for the
// namespace driver, a range per VM for the microvm driver), and a file that
// process creates through a mount idmapped with the mapping lands on disk
// owned by 0, exactly as if host root had written it: the upper dir reads
// the same to captures, diffs and every runtime.
package userns

import "syscall"

const (
	// HostIDBase is the host uid/gid that root inside every namespace
	// sandbox maps to. All of them share one range; they are kept apart by
	// mount and pid namespaces, not by ids.
	HostIDBase = 1_000_000
	// IDMapSize is the number of ids mapped (0..65535 inside).
	IDMapSize = 65536
)

// IDMap is a sandbox id mapping: 0..IDMapSize-1 inside to base.. on the
// host.
func IDMap(base int) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: IDMapSize}}
}

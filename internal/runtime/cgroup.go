package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CgroupParent is the cgroup (under each controller) that holds one child
// cgroup per sandbox, named by its id. Every driver places sandboxes there,
// so their accounting can be read the same way.
const CgroupParent = "cubicle"

// OOMKilled reports whether the kernel OOM-killed anything in sandbox id's
// memory cgroup (cgroup v1 memory.oom_control, or v2 memory.events). It
// must be read before Stop removes the cgroup.
func OOMKilled(id string) bool {
	for _, c := range []struct{ file, key string }{
		{filepath.Join("/sys/fs/cgroup/memory", CgroupParent, id, "memory.oom_control"), "oom_kill"},
		{filepath.Join("/sys/fs/cgroup", CgroupParent, id, "memory.events"), "oom_kill"},
	} {
		data, err := os.ReadFile(c.file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == c.key {
				if n, _ := strconv.Atoi(f[1]); n > 0 {
					return true
				}
			}
		}
	}
	return false
}

// CPU shares of a sandbox: the kernel's defaults, and the least.
const (
	normalShares     = 1024 // cgroup v1 cpu.shares
	backgroundShares = 2
	normalWeight     = 100 // cgroup v2 cpu.weight
	backgroundWeight = 1
)

// CPUWeighter is implemented by drivers that place sandboxes in host
// cgroups under CgroupParent: SetBackground moves a running sandbox to
// the lowest CPU share or back to the normal one (Limits.Background).
type CPUWeighter interface {
	SetBackground(ctx context.Context, id string, background bool) error
}

// SetCgroupBackground sets the CPU share of the cgroup at dir (a
// sandbox's directory in the v1 cpu hierarchy, or its v2 one) to the
// lowest or the normal one.
func SetCgroupBackground(dir string, background bool) error {
	shares, weight := normalShares, normalWeight
	if background {
		shares, weight = backgroundShares, backgroundWeight
	}
	if p := filepath.Join(dir, "cpu.shares"); fileExists(p) {
		return writeCgroup(p, strconv.Itoa(shares))
	}
	return writeCgroup(filepath.Join(dir, "cpu.weight"), strconv.Itoa(weight))
}

// CPUShares is the cgroup v1 cpu.shares for limits l (OCI's
// linux.resources.cpu.shares; runsc and the namespace driver convert it
// for v2).
func (l Limits) CPUShares() uint64 {
	if l.Background {
		return backgroundShares
	}
	return normalShares
}

func writeCgroup(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		return fmt.Errorf("set cgroup %s: %w", filepath.Base(path), err)
	}
	return nil
}

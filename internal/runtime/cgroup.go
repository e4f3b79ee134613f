package runtime

import (
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

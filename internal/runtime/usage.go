package runtime

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Usage is what a running sandbox has used, as its host cgroups count it:
// everything the isolation boundary runs for it (under gVisor the Sentry
// and gofer too).
type Usage struct {
	CPU         time.Duration // cumulative CPU time
	MemoryBytes int64         // memory charged now
}

// Meter is implemented by drivers that can measure a running sandbox.
type Meter interface {
	Usage(ctx context.Context, id string) (Usage, error)
}

// CgroupUsage reads the usage of the cgroup at path rel (e.g.
// "cubicle/<id>") under the cgroup mount root: the unified (v2) hierarchy
// when rel exists there (cpu.stat, memory.current), else the v1 cpuacct
// and memory hierarchies.
func CgroupUsage(root, rel string) (Usage, error) {
	var u Usage
	if dir := filepath.Join(root, rel); fileExists(filepath.Join(dir, "cpu.stat")) {
		usec, err := statField(filepath.Join(dir, "cpu.stat"), "usage_usec")
		if err != nil {
			return u, err
		}
		mem, err := readInt(filepath.Join(dir, "memory.current"))
		u.CPU, u.MemoryBytes = time.Duration(usec)*time.Microsecond, mem
		return u, err
	}
	ns, err := readInt(filepath.Join(root, "cpuacct", rel, "cpuacct.usage"))
	if err != nil {
		return u, err
	}
	mem, err := readInt(filepath.Join(root, "memory", rel, "memory.usage_in_bytes"))
	u.CPU, u.MemoryBytes = time.Duration(ns), mem
	return u, err
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readInt reads a file holding one decimal integer.
func readInt(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read cgroup usage: %w", err)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read cgroup usage %s: %w", path, err)
	}
	return n, nil
}

// statField reads the value of key in a flat-keyed cgroup file ("key value" lines).
func statField(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read cgroup usage: %w", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("read cgroup usage: no %s in %s", key, path)
}

package runtime

import (
	"hash/fnv"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPUs returns the host CPUs sandbox id with limits l runs on, so that it
// sees as many CPUs as it has vCPUs (nproc, /proc/cpuinfo under gVisor, a
// language runtime sizing its thread pool): ceil(MilliCPUs/1000) of the
// CPUs in allowed, consecutive (wrapping) from one id picks, so sandboxes
// spread over the host. It returns nil when the sandbox may use all of
// allowed (or has no CPU limit). The CFS quota still bounds CPU time; the
// set bounds parallelism to what the sandbox was given.
func CPUs(id string, l Limits, allowed []int) []int {
	n := int((l.MilliCPUs + 999) / 1000)
	if l.MilliCPUs <= 0 || n >= len(allowed) {
		return nil
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	start := int(h.Sum32() % uint32(len(allowed)))
	out := make([]int, n)
	for i := range out {
		out[i] = allowed[(start+i)%len(allowed)]
	}
	return out
}

// AllowedCPUs lists the CPUs this process may run on, which sandboxes
// are placed within.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, err
	}
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// CPUList formats cpus as a cpuset list ("0,3").
func CPUList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

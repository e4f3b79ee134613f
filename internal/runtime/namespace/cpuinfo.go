package namespace

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
)

// cpuInfo is the /proc/cpuinfo a sandbox pinned to cpus sees: the host's
// stanzas (host, the host's /proc/cpuinfo) for exactly those CPUs, in the
// order of cpus, renumbered 0..len(cpus)-1 as lxcfs does, so that
// `grep -c ^processor /proc/cpuinfo` agrees with nproc. Stanzas without a
// processor line (trailing machine-wide lines on some architectures) are
// kept at the end. Every CPU of cpus must have a stanza.
func cpuInfo(host []byte, cpus []int) ([]byte, error) {
	byCPU := map[int][]byte{}
	var rest [][]byte
	for _, st := range bytes.Split(bytes.TrimRight(host, "\n"), []byte("\n\n")) {
		n, ok := processorOf(st)
		if !ok {
			rest = append(rest, st)
			continue
		}
		byCPU[n] = st
	}
	var out bytes.Buffer
	for i, c := range cpus {
		st, ok := byCPU[c]
		if !ok {
			return nil, fmt.Errorf("cpuinfo: no stanza for CPU %d", c)
		}
		_, body, _ := bytes.Cut(st, []byte("\n"))
		fmt.Fprintf(&out, "processor\t: %d\n%s\n\n", i, body)
	}
	for _, st := range slices.DeleteFunc(rest, func(b []byte) bool { return len(bytes.TrimSpace(b)) == 0 }) {
		out.Write(st)
		out.WriteString("\n\n")
	}
	return out.Bytes(), nil
}

// processorOf reads the CPU number of a stanza whose first line is
// "processor : N".
func processorOf(stanza []byte) (int, bool) {
	line, _, _ := bytes.Cut(stanza, []byte("\n"))
	key, val, ok := bytes.Cut(line, []byte(":"))
	if !ok || string(bytes.TrimSpace(key)) != "processor" {
		return 0, false
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(val)))
	return n, err == nil
}

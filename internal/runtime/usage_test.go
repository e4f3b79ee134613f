package runtime

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, v := range files {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupUsage(t *testing.T) {
	v2 := t.TempDir()
	writeFiles(t, v2, map[string]string{
		"cubicle/x/cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
		"cubicle/x/memory.current": "4096\n",
	})
	v1 := t.TempDir()
	writeFiles(t, v1, map[string]string{
		"cpuacct/cubicle/x/cpuacct.usage":        "2500000000\n",
		"memory/cubicle/x/memory.usage_in_bytes": "8192\n",
	})
	for name, tc := range map[string]struct {
		root string
		want Usage
	}{
		"v2": {v2, Usage{CPU: 1500 * time.Millisecond, MemoryBytes: 4096}},
		"v1": {v1, Usage{CPU: 2500 * time.Millisecond, MemoryBytes: 8192}},
	} {
		got, err := CgroupUsage(tc.root, "cubicle/x")
		if err != nil || got != tc.want {
			t.Errorf("%s: CgroupUsage = %+v, %v; want %+v", name, got, err, tc.want)
		}
	}
	if _, err := CgroupUsage(v1, "cubicle/missing"); err == nil {
		t.Error("CgroupUsage of a missing cgroup: no error")
	}
}

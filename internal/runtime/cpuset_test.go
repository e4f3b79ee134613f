package runtime

import (
	"slices"
	"testing"
)

func TestCPUs(t *testing.T) {
	all := []int{0, 1, 2, 3}
	for _, c := range []struct {
		milli int64
		want  int // CPUs in the set; 0 = no set
	}{{0, 0}, {500, 1}, {1000, 1}, {1001, 2}, {3000, 3}, {4000, 0}, {8000, 0}} {
		got := CPUs("sb-1", Limits{MilliCPUs: c.milli}, all)
		if len(got) != c.want {
			t.Errorf("MilliCPUs %d: %v, want %d CPUs", c.milli, got, c.want)
		}
		for _, cpu := range got {
			if !slices.Contains(all, cpu) {
				t.Errorf("MilliCPUs %d: CPU %d not allowed", c.milli, cpu)
			}
		}
		if len(got) > 1 && len(slices.Compact(slices.Sorted(slices.Values(got)))) != len(got) {
			t.Errorf("MilliCPUs %d: repeated CPU in %v", c.milli, got)
		}
	}
	// Sandboxes spread: 64 one-vCPU sandboxes use every CPU.
	used := map[int]bool{}
	for i := range 64 {
		for _, c := range CPUs(string(rune('a'+i)), Limits{MilliCPUs: 1000}, all) {
			used[c] = true
		}
	}
	if len(used) != len(all) {
		t.Fatalf("64 sandboxes used CPUs %v of %v", used, all)
	}
	if got := CPUList([]int{1, 3}); got != "1,3" {
		t.Fatalf("CPUList = %q", got)
	}
}

package namespace

import (
	"strings"
	"testing"
)

func TestCPUInfo(t *testing.T) {
	host := "processor\t: 0\nmodel name\t: A\napicid\t\t: 0\n\n" +
		"processor\t: 1\nmodel name\t: B\napicid\t\t: 2\n\n" +
		"processor\t: 2\nmodel name\t: C\napicid\t\t: 4\n\n" +
		"Hardware\t: board\n\n"
	got, err := cpuInfo([]byte(host), []int{2, 0})
	if err != nil {
		t.Fatal(err)
	}
	want := "processor\t: 0\nmodel name\t: C\napicid\t\t: 4\n\n" +
		"processor\t: 1\nmodel name\t: A\napicid\t\t: 0\n\n" +
		"Hardware\t: board\n\n"
	if string(got) != want {
		t.Errorf("cpuinfo for CPUs 2,0:\n%s\nwant:\n%s", got, want)
	}
	if n := strings.Count(string(got), "processor\t:"); n != 2 {
		t.Errorf("%d processor lines, want 2", n)
	}
	if _, err := cpuInfo([]byte(host), []int{7}); err == nil {
		t.Error("CPU 7 has no stanza: want an error")
	}
}

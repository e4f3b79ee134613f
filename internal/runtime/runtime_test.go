package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLimitsDerived(t *testing.T) {
	for _, c := range []struct {
		l            Limits
		tasks, tmpfs int64
	}{
		{Limits{}, 0, DefaultTmpfsBytes},
		{Limits{PidsMax: 4096}, 4096, DefaultTmpfsBytes},
		{Limits{MemBytes: 1 << 30, PidsMax: 4096}, 1024, 256 << 20},
		{Limits{MemBytes: 16 << 30, PidsMax: 4096}, 4096, 4 << 30},
		{Limits{MemBytes: 16 << 20, PidsMax: 4096}, MinTasks, 4 << 20},
		{Limits{MemBytes: 64 << 20}, 64, 16 << 20},
	} {
		if got := c.l.Tasks(); got != c.tasks {
			t.Errorf("%+v.Tasks() = %d, want %d", c.l, got, c.tasks)
		}
		if got := c.l.TmpfsBytes(); got != c.tmpfs {
			t.Errorf("%+v.TmpfsBytes() = %d, want %d", c.l, got, c.tmpfs)
		}
	}
}

func TestValidateMounts(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ok := []Mount{{Source: dir, Target: "/data"}, {Source: dir, Target: "/home/user/cache", ReadOnly: true}}
	if err := ValidateMounts(ok); err != nil {
		t.Fatalf("valid mounts: %v", err)
	}
	for _, bad := range [][]Mount{
		{{Source: dir, Target: "data"}},
		{{Source: dir, Target: "/"}},
		{{Source: dir, Target: "/data/../etc"}},
		{{Source: dir, Target: "/proc"}},
		{{Source: dir, Target: "/dev/shm"}},
		{{Source: dir, Target: "/.cubicle/x"}},
		{{Source: dir, Target: "/d"}, {Source: dir, Target: "/d"}},
		{{Source: file, Target: "/d"}},
		{{Source: filepath.Join(dir, "missing"), Target: "/d"}},
	} {
		if err := ValidateMounts(bad); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}

package runtime

import "testing"

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

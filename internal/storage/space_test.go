package storage

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/health"
)

// TestSpaceAndCheck: the loop store reports its own and its host's space,
// writes show in it, and the health check turns degraded, then failing, as
// the reserve grows past what is usable, and failing when the store is
// read-only.
func TestSpaceAndCheck(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	sp, err := c.Space()
	if err != nil {
		t.Fatal(err)
	}
	if sp.Host == nil || sp.Host.Path != dir || sp.Store.Path != c.Root() {
		t.Fatalf("space %+v: want the store at %s and its host at %s", sp, c.Root(), dir)
	}
	if sp.Store.Total <= 1<<30 || sp.Store.Total > 2<<30 || sp.Usable != min(sp.Store.Free, sp.Host.Free) {
		t.Fatalf("space %+v: want a ~2 GiB store and usable = min(store, host) free", sp)
	}
	big := make([]byte, 64<<20)
	if err := os.WriteFile(filepath.Join(c.Root(), "fill"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	after, err := c.Space()
	if err != nil {
		t.Fatal(err)
	}
	if after.Store.Free > sp.Store.Free-32<<20 {
		t.Fatalf("store free %d after writing 64 MiB, was %d", after.Store.Free, sp.Store.Free)
	}

	usable := after.Usable
	if err := c.Check(usable / 4)(ctx); err != nil {
		t.Fatalf("check with a small reserve: %v", err)
	}
	if err := c.Check(usable * 3 / 4)(ctx); !health.IsWarning(err) {
		t.Fatalf("check under twice the reserve = %v, want a warning", err)
	}
	if err := c.Check(usable + 1<<30)(ctx); err == nil || health.IsWarning(err) || !strings.Contains(err.Error(), "below") {
		t.Fatalf("check under the reserve = %v, want a (non-warning) failure", err)
	}

	if err := unix.Mount("", c.Root(), "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Mount("", c.Root(), "", unix.MS_REMOUNT, "")
	if err := c.Check(0)(ctx); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("check of a read-only store = %v", err)
	}
	if err := unix.Mount("", c.Root(), "", unix.MS_REMOUNT, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.Check(0)(ctx); err != nil {
		t.Fatalf("check after remounting read-write: %v", err)
	}
}

package storage

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestListAndQuarantine: List names every sandbox with storage; Quarantine
// unmounts one's rootfs and moves its volume (with what it wrote) aside
// under the store's orphans dir, and it is no longer listed.
func TestListAndQuarantine(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	o, err := New(filepath.Join(dir, "sandboxes"), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	lower := t.TempDir()
	for _, id := range []string{"a1", "b2"} {
		upper, err := o.Prepare(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(upper, "f"), []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := o.Mount(ctx, id, []string{lower}); err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := o.List(ctx); err != nil || !slices.Equal(ids, []string{"a1", "b2"}) {
		t.Fatalf("List = %v, %v", ids, err)
	}
	moved, err := o.Quarantine(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(moved, filepath.Join(c.Root(), volOrphans, "a1-")) {
		t.Fatalf("moved to %q", moved)
	}
	if b, err := os.ReadFile(filepath.Join(moved, "upper", "f")); err != nil || string(b) != "a1" {
		t.Fatalf("quarantined data: %q %v", b, err)
	}
	if mounted(o.RootFS("a1")) {
		t.Fatal("quarantined rootfs still mounted")
	}
	if ids, err := o.List(ctx); err != nil || !slices.Equal(ids, []string{"b2"}) {
		t.Fatalf("List after quarantine = %v, %v", ids, err)
	}

	// A captured layer is a read-only subvolume: quarantining it keeps
	// its files and drops it from the list.
	if _, err := o.Capture(ctx, "b2", "snapx"); err != nil {
		t.Fatal(err)
	}
	if ids, err := o.ListCaptures(ctx); err != nil || !slices.Equal(ids, []string{"snapx"}) {
		t.Fatalf("ListCaptures = %v, %v", ids, err)
	}
	moved, err = o.QuarantineCapture(ctx, "snapx")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(moved, "upper", "f")); err != nil || string(b) != "b2" {
		t.Fatalf("quarantined capture: %q %v", b, err)
	}
	if ids, err := o.ListCaptures(ctx); err != nil || len(ids) != 0 {
		t.Fatalf("ListCaptures after quarantine = %v, %v", ids, err)
	}
	o.Remove(ctx, "b2")
}

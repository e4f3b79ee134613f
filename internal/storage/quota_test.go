package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLimitEnforcesCapacity: after Limit, writing past the cap into the
// sandbox's upper dir fails with EDQUOT, and writing under it works.
func TestLimitEnforcesCapacity(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	o, err := New(filepath.Join(dir, "sandboxes"), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	upper, err := o.Prepare(ctx, "q1")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := o.Limit(ctx, "q1", 8<<20); err != nil || !ok {
		t.Fatalf("Limit: enforced %v, %v", ok, err)
	}
	if err := os.WriteFile(filepath.Join(upper, "small"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatalf("1 MiB under an 8 MiB cap: %v", err)
	}
	f, err := os.Create(filepath.Join(upper, "big"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	var werr error
	for i := 0; i < 32 && werr == nil; i++ {
		_, werr = f.Write(chunk)
		if werr == nil {
			werr = f.Sync()
		}
	}
	if !errors.Is(werr, unix.EDQUOT) {
		t.Fatalf("32 MiB into an 8 MiB cap: %v, want EDQUOT", werr)
	}
}

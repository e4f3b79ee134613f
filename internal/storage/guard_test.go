package storage

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestShareRoom(t *testing.T) {
	vols := []guardedVolume{{id: "big", rfer: 10, need: 1000}, {id: "small", rfer: 20, need: 100}, {id: "mid", rfer: 30, need: 500}}
	for _, tc := range []struct {
		room int64
		want map[string]int64
	}{
		{3000, map[string]int64{"big": 1010, "small": 120, "mid": 530}}, // room for every need
		{600, map[string]int64{"small": 120, "mid": 280, "big": 260}},   // small takes 100, the rest halve 500
		{0, map[string]int64{"big": 10, "small": 20, "mid": 30}},        // no room: no growth
	} {
		got := shareRoom(vols, tc.room)
		for id, w := range tc.want {
			if got[id] != w {
				t.Errorf("room %d: %s limit %d, want %d (all %v)", tc.room, id, got[id], w, got)
			}
		}
	}
}

// fill writes 1 MiB chunks to path until a write fails or max MiB are
// written, returning the MiB written and the error.
func fill(t *testing.T, path string, max int) (int, error) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for i := 0; i < max; i++ {
		if _, err := f.Write(chunk); err != nil {
			return i, err
		}
		if err := f.Sync(); err != nil {
			return i, err
		}
	}
	return max, nil
}

// TestSpaceGuard: with little room above the reserve, each sandbox may
// grow only by its share and then gets EDQUOT (not EIO, not a read-only
// store); with room again, its limit is its capacity.
func TestSpaceGuard(t *testing.T) {
	c, dir := loopStore(t)
	ctx := context.Background()
	o, err := New(filepath.Join(dir, "sandboxes"), WithCoW(c))
	if err != nil {
		t.Fatal(err)
	}
	sp, err := c.Space()
	if err != nil {
		t.Fatal(err)
	}
	// 200 MiB of room above the reserve, shared by two sandboxes.
	tight := o.Guard(sp.Usable-200<<20, slog.New(slog.DiscardHandler))
	if tight == nil {
		t.Fatal("no guard on a btrfs store with quotas")
	}
	uppers := map[string]string{}
	for _, id := range []string{"a1", "b2"} {
		if uppers[id], err = o.Prepare(ctx, id); err != nil {
			t.Fatal(err)
		}
		if ok, err := o.Limit(ctx, id, 1<<30); err != nil || !ok {
			t.Fatalf("Limit: %v %v", ok, err)
		}
	}
	if err := tight.Step(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := fill(t, filepath.Join(uppers["a1"], "f"), 400)
	if !errors.Is(err, syscall.EDQUOT) || n < 50 || n > 150 {
		t.Fatalf("a1 wrote %d MiB then %v; want EDQUOT after about its 100 MiB share", n, err)
	}
	sp2, err := c.Space()
	if err != nil || sp2.Store.ReadOnly {
		t.Fatalf("store after the cap: %+v %v", sp2, err)
	}

	// Room again (no reserve): the limit goes back to the capacity.
	roomy := o.Guard(0, slog.New(slog.DiscardHandler))
	if err := roomy.Step(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := fill(t, filepath.Join(uppers["a1"], "f"), 200); err != nil {
		t.Fatalf("a1 with room again: %d MiB then %v", n, err)
	}
}

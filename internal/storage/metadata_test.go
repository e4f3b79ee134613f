package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/health"
)

// TestMetadataOf: metadata free is its chunks' free part less the global
// reserve plus what unallocated space gives it (halved under DUP); data
// and mixed block groups do not count.
func TestMetadataOf(t *testing.T) {
	infos := []btrfsSpaceInfo{
		{flags: bgData, total: 900 << 20, used: 800 << 20},
		{flags: bgMetadata | bgDUP, total: 100 << 20, used: 60 << 20},
		{flags: 2, total: 8 << 20, used: 1 << 20}, // system
		{flags: spaceGlobalR | bgMetadata, total: 10 << 20},
	}
	m := metadataOf(infos, 40<<20)
	if m.Total != 100<<20 || m.Used != 60<<20 || m.Unallocated != 40<<20 {
		t.Fatalf("metadata %+v", m)
	}
	if want := int64(100-60-10+20) << 20; m.Free != want {
		t.Fatalf("free %d, want %d", m.Free, want)
	}
	if MetadataReserve(140<<20) != 16<<20 || MetadataReserve(4<<30) != 64<<20 || MetadataReserve(1<<40) != 512<<20 {
		t.Fatal("reserve not 1/64 of the store within [16 MiB, 512 MiB]")
	}
	if full := metadataOf([]btrfsSpaceInfo{{flags: bgMetadata, total: 10, used: 10}, {flags: spaceGlobalR, total: 5}}, 0); full.Free != 0 {
		t.Fatalf("an over-reserved metadata space has %d free", full.Free)
	}
}

// TestMetadataLowAndBalance fills a small loop btrfs the way that turns
// btrfs read-only — data chunks take the whole device, then small files
// with xattrs (metadata only) fill the metadata chunks — and checks that
// the store reports its metadata and the health check fails on it. Then
// half the data goes: its chunks are half empty but still allocated, so
// metadata could not grow; the space guard's balance compacts them and
// gives the device space back, and the check passes.
func TestMetadataLowAndBalance(t *testing.T) {
	c, _ := loopStoreSized(t, 256<<20)
	ctx := context.Background()
	sp, err := c.Space()
	if err != nil {
		t.Fatal(err)
	}
	m := sp.Metadata
	if m == nil || m.Total <= 0 || m.Used <= 0 || m.Free <= m.Reserve || m.Unallocated <= 0 {
		t.Fatalf("fresh store's metadata %+v", m)
	}
	t.Logf("fresh: %+v", *m)
	// Data chunks take the device.
	mb := make([]byte, 1<<20)
	var files []string
	for i := 0; ; i++ {
		p := filepath.Join(c.Root(), fmt.Sprint("data", i))
		if err := os.WriteFile(p, mb, 0o644); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		files = append(files, p)
	}
	unix.Sync()
	// Empty files with a large xattr take metadata only.
	small := filepath.Join(c.Root(), "small")
	if err := os.Mkdir(small, 0o755); err != nil {
		t.Fatal(err)
	}
	payload := []byte(strings.Repeat("m", 3000))
	for i := 0; ; i++ {
		p := filepath.Join(small, fmt.Sprint(i))
		if os.WriteFile(p, nil, 0o644) != nil || unix.Setxattr(p, "user.pad", payload, 0) != nil {
			break // metadata is full
		}
		if i%500 == 499 {
			unix.Sync()
			if err := c.Check(0)(ctx); err != nil && strings.Contains(err.Error(), "metadata low") && !health.IsWarning(err) {
				break
			}
		}
	}
	unix.Sync()
	sp, _ = c.Space()
	t.Logf("full: %+v; data usable %d", *sp.Metadata, sp.Usable)
	if err := c.Check(0)(ctx); err == nil || health.IsWarning(err) || !strings.Contains(err.Error(), "btrfs metadata low") {
		t.Fatalf("check with metadata at %+v = %v, want metadata low (failing)", *sp.Metadata, err)
	}

	if err := os.RemoveAll(small); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(files); i += 2 {
		if err := os.Remove(files[i]); err != nil {
			t.Fatal(err)
		}
	}
	unix.Sync()
	sp, _ = c.Space()
	t.Logf("half the data deleted: %+v", *sp.Metadata)
	if sp.Metadata.Unallocated > 4<<20 {
		t.Fatalf("half-empty data chunks were given back without a balance: %+v", *sp.Metadata)
	}
	g := &SpaceGuard{o: &Overlays{cow: c}, log: slog.New(slog.DiscardHandler)}
	if err := g.TendMetadata(ctx); err != nil {
		t.Fatal(err)
	}
	sp, _ = c.Space()
	t.Logf("balanced: %+v", *sp.Metadata)
	if sp.Metadata.Unallocated < 16<<20 || sp.Metadata.Free < 2*sp.Metadata.Reserve {
		t.Fatalf("metadata after the balance: %+v", *sp.Metadata)
	}
	if err := c.Check(0)(ctx); err != nil {
		t.Fatalf("check after the balance: %v", err)
	}
}

package image

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/image/imagetest"
)

// pullCounter is a PullMeter that records what it is told.
type pullCounter struct {
	pulls, failed int
	bytes         int64
}

func (p *pullCounter) ImagePull(n int64, err error) {
	p.pulls++
	p.bytes += n
	if err != nil {
		p.failed++
	}
}

func TestPullsAreMetered(t *testing.T) {
	requireRoot(t)
	host, _ := countingRegistry(t)
	ref := imagetest.Push(t, host, "base/busybox:1", imagetest.BusyboxImage(t))
	m := &pullCounter{}
	s, err := NewStore(filepath.Join(t.TempDir(), "images"), WithLogger(slog.New(slog.DiscardHandler)), WithPullMeter(m))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resolve(context.Background(), wsA, ref, nil, nil); err != nil {
		t.Fatal(err)
	}
	if m.pulls != 1 || m.failed != 0 || m.bytes < 1<<20 {
		t.Fatalf("after one pull: %+v, want 1 pull of ≥ 1 MiB", m)
	}
	if _, err := s.Resolve(context.Background(), wsA, host+"/base/missing:1", nil, nil); err == nil {
		t.Fatal("resolving a missing image succeeded")
	}
	if m.pulls != 2 || m.failed != 1 {
		t.Fatalf("after a failed pull: %+v, want 2 pulls, 1 failed", m)
	}
}

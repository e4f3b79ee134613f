package api

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// fakePools keeps pools by snapshot; only sn1 exists.
type fakePools struct{ p map[string]store.Pool }

func (f *fakePools) SetPool(_ context.Context, snap string, size, maxAge int64) (sandbox.PoolStatus, error) {
	if snap != "sn1" {
		return sandbox.PoolStatus{}, fmt.Errorf("snapshot %s: %w", snap, errdefs.ErrNotFound)
	}
	f.p[snap] = store.Pool{SnapshotID: snap, Size: size, MaxAgeSeconds: maxAge}
	return sandbox.PoolStatus{Pool: f.p[snap], Ready: 1}, nil
}

func (f *fakePools) Pool(_ context.Context, snap string) (sandbox.PoolStatus, error) {
	if snap != "sn1" {
		return sandbox.PoolStatus{}, fmt.Errorf("snapshot %s: %w", snap, errdefs.ErrNotFound)
	}
	return sandbox.PoolStatus{Pool: f.p[snap], Ready: 1}, nil
}

func TestPoolRoutes(t *testing.T) {
	ta := &testAPI{mgr: newFakeSandboxes(), images: &fakeImages{}}
	ta.srv = New(ta.mgr, fakeAuth{}, ta.images, "http://api.test/", slog.New(slog.DiscardHandler))
	fp := &fakePools{p: map[string]store.Pool{}}
	ta.srv.EnablePools(fp)
	path := "/v2/sandboxes/snapshots/sn1/pool"
	code, got := ta.do(t, "PUT", path, adminKey, map[string]any{"size": 3, "max_age_seconds": 600})
	if code != 200 || field(got, "size") != 3.0 || field(got, "max_age_seconds") != 600.0 || field(got, "ready") != 1.0 || field(got, "snapshot_id") != "sn1" {
		t.Fatalf("PUT = %d %v", code, got)
	}
	if fp.p["sn1"].Size != 3 {
		t.Fatalf("stored %+v", fp.p)
	}
	if code, got := ta.do(t, "GET", "/api"+path, memberKey, nil); code != 200 || field(got, "size") != 3.0 {
		t.Fatalf("GET = %d %v", code, got)
	}
	for _, f := range []string{"size", "max_age_seconds"} {
		code, got := ta.do(t, "PUT", path, adminKey, map[string]any{f: -1})
		if loc, _ := validation(got); code != 422 || loc != "body/"+f {
			t.Errorf("negative %s = %d %v", f, code, got)
		}
	}
	if code, _ := ta.do(t, "GET", "/v2/sandboxes/snapshots/nope/pool", adminKey, nil); code != 404 {
		t.Errorf("pool of an unknown snapshot = %d", code)
	}
	if code, _ := ta.do(t, "PUT", path, "", map[string]any{"size": 1}); code != 401 {
		t.Errorf("PUT without a key = %d", code)
	}
}

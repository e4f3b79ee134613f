package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestLeftoversAreCleanedAtRecover: a sandbox whose record vanished while
// its instance, endpoint and files remained (a crash between the record's
// deletion and its cleanup, or a lost database) is found, its instance
// stopped and endpoint torn down at the next start, and its files moved
// aside, not deleted; sandboxes with records are untouched.
func TestLeftoversAreCleanedAtRecover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	kept := e.create(t, member, "kept")
	lost := e.create(t, member, "lost")
	rid := runtimeID(lost.ID)
	if err := os.WriteFile(filepath.Join(e.storage.UpperDir(rid), "work.txt"), []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if left, err := e.m.Leftovers(ctx); err != nil || len(left) != 0 {
		t.Fatalf("leftovers with every record present: %v %v", left, err)
	}
	if err := e.st.DeleteSandbox(ctx, lost.ID); err != nil {
		t.Fatal(err)
	}
	left, err := e.m.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []Leftover{{Kind: LeftoverRuntime, ID: rid, Runtime: "fake"}, {Kind: LeftoverNetwork, ID: rid}, {Kind: LeftoverStorage, ID: rid}}
	if len(left) != len(want) {
		t.Fatalf("leftovers %+v, want %+v", left, want)
	}
	for i := range want {
		if left[i] != want[i] {
			t.Fatalf("leftovers %+v, want %+v", left, want)
		}
	}

	e.reopen(t) // Recover cleans them
	if left, err := e.m.Leftovers(ctx); err != nil || len(left) != 0 {
		t.Fatalf("leftovers after recovery: %v %v", left, err)
	}
	if running, _ := e.driver.Running(ctx, rid); running {
		t.Fatal("the leftover instance still runs")
	}
	b, err := os.ReadFile(filepath.Join(e.storage.Root, "orphans", rid, "upper", "work.txt"))
	if err != nil || string(b) != "precious" {
		t.Fatalf("the leftover's files were not kept aside: %q %v", b, err)
	}
	if running, _ := e.driver.Running(ctx, runtimeID(kept.ID)); !running || e.get(t, kept.ID).Status != "ready" {
		t.Fatal("a sandbox with a record was touched")
	}
}

// TestLeftoversSkipTransientIDs: the record-less volume of a build step in
// progress is not a leftover until the step lets go of it.
func TestLeftoversSkipTransientIDs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	release := e.m.holdTransient("buildstep1")
	if _, err := e.storage.Prepare(ctx, "buildstep1"); err != nil {
		t.Fatal(err)
	}
	if left, err := e.m.Leftovers(ctx); err != nil || len(left) != 0 {
		t.Fatalf("leftovers while the step holds its id: %v %v", left, err)
	}
	release()
	if left, err := e.m.Leftovers(ctx); err != nil || len(left) != 1 || left[0].ID != "buildstep1" {
		t.Fatalf("leftovers after the step let go: %v %v", left, err)
	}
}

// TestCaptureLeftovers: a captured layer no snapshot holds (a crash
// between the capture and its record) is a leftover, moved aside on
// cleanup; layers of recorded snapshots and memory images of sandboxes
// are not.
func TestCaptureLeftovers(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb := e.create(t, member, "box")
	for _, id := range []string{"orphan-snap", e.snap.ID, sb.ID} {
		if err := os.MkdirAll(filepath.Join(e.storage.Root, "captures", id, "layer"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	left, err := e.m.Leftovers(ctx)
	if err != nil || len(left) != 1 || left[0] != (Leftover{Kind: LeftoverCapture, ID: "orphan-snap"}) {
		t.Fatalf("leftovers: %+v %v", left, err)
	}
	done, err := e.m.CleanLeftovers(ctx)
	if err != nil || len(done) != 1 || done[0].Moved == "" {
		t.Fatalf("clean: %+v %v", done, err)
	}
	if _, err := os.Stat(filepath.Join(done[0].Moved, "layer")); err != nil {
		t.Fatalf("the orphaned layer was not kept aside: %v", err)
	}
	if left, err := e.m.Leftovers(ctx); err != nil || len(left) != 0 {
		t.Fatalf("leftovers after cleaning: %+v %v", left, err)
	}
}

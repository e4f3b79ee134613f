package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestProbe: a driver whose runsc loses its execute bit or disappears
// reports it; an intact one passes.
func TestProbe(t *testing.T) {
	dir := t.TempDir()
	runsc := filepath.Join(dir, "runsc")
	if err := os.WriteFile(runsc, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(runsc, filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := d.Probe(ctx); err != nil {
		t.Fatalf("intact driver: %v", err)
	}
	if err := os.Chmod(runsc, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Probe(ctx); err == nil {
		t.Fatal("probe passed with runsc not executable")
	}
	if err := os.Remove(runsc); err != nil {
		t.Fatal(err)
	}
	if err := d.Probe(ctx); err == nil {
		t.Fatal("probe passed with runsc missing")
	}
}

package gvisor

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRunscDeadline: a runsc that never returns (a Sentry that does not
// answer) fails the driver's call once its deadline passes, even when the
// caller's context has none.
func TestRunscDeadline(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(fake, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d.runscTimeout = 200 * time.Millisecond
	id := "0123456789abcdef0123456789abcdef"
	ctx := context.Background()
	for name, call := range map[string]func() error{
		"state":  func() error { _, err := d.PID(ctx, id); return err },
		"pause":  func() error { return d.Pause(ctx, id) },
		"resume": func() error { return d.Resume(ctx, id) },
	} {
		t0 := time.Now()
		err := call()
		if took := time.Since(t0); err == nil || took > 5*time.Second {
			t.Errorf("%s: %v after %v, want an error after about %v", name, err, took, d.runscTimeout)
		}
	}
	if got := d.deadline([]string{"--log", "/x", "restore", "--image-path", "/i"}); got != runscStartTimeout {
		t.Errorf("restore deadline %v", got)
	}
	if got := d.deadline([]string{"checkpoint", "--image-path", "/i", "--leave-running", id}); got != runscSaveTimeout {
		t.Errorf("checkpoint deadline %v", got)
	}
}

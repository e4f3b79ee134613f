package mounts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
)

// TestGCSMount reads, lists, writes and renames on a GCS bucket served by
// fake-gcs-server, with tokens minted from a service-account key.
func TestGCSMount(t *testing.T) {
	g := mountstest.StartGCS(t, "gbkt")
	g.Put(t, "gbkt", "pre/a.txt", []byte("from gcs"))
	cfg := fmt.Appendf(nil, `{"auth":{"gcp":{"service_account_json":{"type":"opaque","value":%q}}},
		"mounts":[{"id":"g","type":"gcs","mount_path":"/g","gcs":{"bucket":"gbkt","prefix":"pre"}}]}`, g.KeyJSON)
	svc, err := New(Options{AllowLoopback: true, Dir: t.TempDir(), GCSEndpoint: g.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	binds, err := svc.Up(context.Background(), "sb", "ws", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Remove(context.Background(), "sb")
	mnt := binds[0].Source
	if b, err := os.ReadFile(filepath.Join(mnt, "a.txt")); err != nil || string(b) != "from gcs" {
		t.Fatalf("read = %q, %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "b.txt"), []byte("from the mount"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(mnt, "b.txt"), filepath.Join(mnt, "c.txt")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, ok := g.Get(t, "gbkt", "pre/c.txt")
		_, stale := g.Get(t, "gbkt", "pre/b.txt")
		if ok && string(b) == "from the mount" && !stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pre/c.txt = %q (%v), pre/b.txt still there %v", b, ok, stale)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if names := list(t, mnt); !slices.Equal(names, []string{"a.txt", "c.txt"}) {
		t.Fatalf("ls = %v", names)
	}
}

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// TestLeftoversAfterALostRecord: a sandbox whose record is gone while its
// instance, network and files remain (the daemon crashed, then its row
// was lost) is cleaned at the next start — instance stopped, endpoint torn
// down — and its files are moved to <data-dir>/cow/orphans intact; the
// neighbour with a record keeps running.
func TestLeftoversAfterALostRecord(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			c := d.Client
			ctx := context.Background()
			base := readySnapshot(t, c, "base", ref)
			kept := newSandbox(t, c, base.ID, nil)
			lost := newSandbox(t, c, base.ID, nil)
			mustRun(t, c, lost.Name, "echo precious > /work.txt")
			if left, err := c.Leftovers(ctx); err != nil || len(left) != 0 {
				t.Fatalf("leftovers with every record present: %v %v", left, err)
			}

			d.kill9()
			st, err := store.OpenSQLite(ctx, filepath.Join(d.dataDir, "cubicle.db"))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.DeleteSandbox(ctx, lost.ID); err != nil {
				t.Fatal(err)
			}
			st.Close()
			d.restart()

			if left, err := c.Leftovers(ctx); err != nil || len(left) != 0 {
				t.Fatalf("leftovers after the restart: %v %v", left, err)
			}
			rid := strings.ReplaceAll(lost.ID, "-", "")
			matches, _ := filepath.Glob(filepath.Join(d.dataDir, "cow", "orphans", rid+"-*", "upper", "work.txt"))
			if len(matches) != 1 {
				t.Fatalf("orphaned files: %v", matches)
			}
			if b, err := os.ReadFile(matches[0]); err != nil || string(b) != "precious\n" {
				t.Fatalf("orphaned file: %q %v", b, err)
			}
			if out := mustRun(t, c, kept.Name, "echo alive"); out != "alive\n" {
				t.Fatalf("the neighbour: %q", out)
			}
		})
	}
}

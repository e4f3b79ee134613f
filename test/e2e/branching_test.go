package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// counterLoop starts a detached loop in the sandbox that bumps /tmp/counter
// every 20 ms, to show a sandbox keeps running across a capture.
const counterLoop = `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.02; done' </dev/null >/dev/null 2>&1 &`

func counter(t *testing.T, c *cubicle.Client, name string) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(mustRun(t, c, name, "cat /tmp/counter")))
	if err != nil {
		t.Fatalf("counter in %s: %v", name, err)
	}
	return n
}

func wantStatus(t *testing.T, err error, status int) {
	t.Helper()
	var ae *cubicle.APIError
	if !errors.As(err, &ae) || ae.Status != status {
		t.Fatalf("got %v, want HTTP %d", err, status)
	}
}

// TestBranching captures a running sandbox, forks it, and checks that the
// parent keeps running, branches diverge and get their own identity, that a
// snapshot others depend on cannot be deleted, that stacked snapshots work
// and that all of it survives a daemon crash.
func TestBranching(t *testing.T) {
	ref := testImage(t)
	for _, rt := range withMicroVM() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			c := d.Client
			ctx := context.Background()
			info, err := c.Info(ctx)
			if err != nil || info.Storage != "btrfs-loop" {
				t.Fatalf("info: %+v %v (want storage btrfs-loop on this ext4 host)", info, err)
			}
			// Every check passes and the loop store's space and its host's are reported.
			if info.Status != "ok" || !info.OK || info.Space == nil || info.Space.Host == nil || info.Space.Usable <= 0 || len(info.Checks) < 3 {
				t.Fatalf("health: %+v (space %+v)", info, info.Space)
			}
			base := readySnapshot(t, c, "base", ref)
			p := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "parent" })
			mustRun(t, c, p.Name, "mkdir -p /work && echo parent > /work/f && echo doomed > /work/gone && "+counterLoop)
			time.Sleep(200 * time.Millisecond)
			before := counter(t, c, p.Name)

			sn, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "cap1"})
			if err != nil {
				t.Fatal(err)
			}
			if sn.Status != protocol.SnapshotReady || sn.SourceSandboxID != p.ID {
				t.Fatalf("captured snapshot: %+v", sn)
			}
			time.Sleep(300 * time.Millisecond)
			if after := counter(t, c, p.Name); after <= before+3 {
				t.Fatalf("parent stopped counting across capture: %d then %d", before, after)
			}
			if rt != "gvisor" { // gvisor: see memsnap_test.go
				_, err = c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "mem", IncludeMemory: true})
				wantStatus(t, err, http.StatusUnprocessableEntity)
			}
			_, err = c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "img", DockerImage: "x:1"})
			wantStatus(t, err, http.StatusUnprocessableEntity)

			// Branches start from the parent as it is at the fork, and do
			// not see what it does afterwards.
			mustRun(t, c, p.Name, "echo forked > /work/f && rm /work/gone")
			fork, err := c.Fork(ctx, p.Name, protocol.ForkRequest{Count: 3, Names: []string{"b0", "b1", "b2"}})
			if err != nil {
				t.Fatal(err)
			}
			mustRun(t, c, p.Name, "echo later > /work/f")
			if len(fork.Sandboxes) != 3 {
				t.Fatalf("fork: %+v", fork)
			}
			parentID := mustRun(t, c, p.Name, "cat /etc/machine-id 2>/dev/null; true")
			ids := map[string]bool{}
			for _, b := range fork.Sandboxes {
				if got := mustRun(t, c, b.Name, "cat /work/f; test -e /work/gone && echo LEAK; hostname"); got != "forked\n"+b.Name+"\n" {
					t.Fatalf("branch %s sees %q", b.Name, got)
				}
				id := strings.TrimSpace(mustRun(t, c, b.Name, "cat /etc/machine-id"))
				if len(id) != 32 || ids[id] || id == strings.TrimSpace(parentID) {
					t.Fatalf("branch %s machine-id %q not fresh (parent %q, others %v)", b.Name, id, parentID, ids)
				}
				ids[id] = true
			}
			mustRun(t, c, "b0", "echo mine > /work/f && echo only-b0 > /work/b0")
			for _, name := range []string{"b1", "b2", p.Name} {
				got := mustRun(t, c, name, "cat /work/f; test -e /work/b0 && echo LEAK; true")
				want := "forked\n"
				if name == p.Name {
					want = "later\n"
				}
				if got != want {
					t.Fatalf("%s sees %q after b0 wrote, want %q", name, got, want)
				}
			}
			sb, err := c.GetSandbox(ctx, "b1")
			if err != nil || sb.FSUsedBytes == nil || *sb.FSUsedBytes > 1<<20 {
				t.Fatalf("fresh branch fs_used_bytes: %+v %v", sb, err)
			}

			// Deleting what a branch boots from is refused; the branch lives on.
			wantStatus(t, c.DeleteSnapshot(ctx, fork.SnapshotID), http.StatusConflict)
			mustRun(t, c, "b1", "cat /work/f")

			// Stacking: capture a branch; its snapshot depends on the fork's layer.
			st, err := c.CaptureSnapshot(ctx, "b0", protocol.CaptureSnapshotRequest{Name: "stacked"})
			if err != nil {
				t.Fatal(err)
			}
			s1 := newSandbox(t, c, st.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "s1" })
			if got := mustRun(t, c, s1.Name, "cat /work/f /work/b0"); got != "mine\nonly-b0\n" {
				t.Fatalf("stacked sandbox sees %q", got)
			}
			for _, b := range fork.Sandboxes {
				if err := c.DeleteSandbox(ctx, b.Name); err != nil {
					t.Fatal(err)
				}
			}
			wantStatus(t, c.DeleteSnapshot(ctx, fork.SnapshotID), http.StatusConflict)

			// A crash keeps snapshots, branches and their files.
			d.kill9()
			d.restart()
			if got := mustRun(t, c, s1.Name, "cat /work/f /work/b0"); got != "mine\nonly-b0\n" {
				t.Fatalf("after restart s1 sees %q", got)
			}
			if _, err := c.GetSnapshot(ctx, fork.SnapshotID); err != nil {
				t.Fatal(err)
			}

			// Unwind: the stacked snapshot, then the fork's, whose layer goes.
			if err := c.DeleteSandbox(ctx, s1.Name); err != nil {
				t.Fatal(err)
			}
			if err := c.DeleteSnapshot(ctx, st.ID); err != nil {
				t.Fatal(err)
			}
			if err := c.DeleteSnapshot(ctx, fork.SnapshotID); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(d.dataDir, "cow", "snapshots", fork.SnapshotID)); !os.IsNotExist(err) {
				t.Fatalf("captured layer of deleted snapshot still there: %v", err)
			}
		})
	}
}

// TestDiffAndReset scripts a set of changes after a capture and checks the
// diff lists exactly them, then resets the sandbox back to the capture.
func TestDiffAndReset(t *testing.T) {
	ref := testImage(t)
	for _, rt := range runtimes() {
		t.Run(rt, func(t *testing.T) {
			d := startDaemon(t, rt, "")
			c := d.Client
			ctx := context.Background()
			base := readySnapshot(t, c, "base", ref)
			p := newSandbox(t, c, base.ID, func(r *protocol.CreateSandboxRequest) { r.Name = "box" })
			mustRun(t, c, p.Name, "mkdir -p /d/sub && echo 1234 > /d/mod && echo x > /d/del && echo r > /d/old && echo c > /d/chm && echo s > /d/sub/f")
			sn, err := c.CaptureSnapshot(ctx, p.Name, protocol.CaptureSnapshotRequest{Name: "before"})
			if err != nil {
				t.Fatal(err)
			}
			mustRun(t, c, p.Name, "echo new > /d/add && echo 5678 > /d/mod && rm /d/del && mv /d/old /d/renamed && chmod 600 /d/chm && rm -r /d/sub")
			diff, err := c.Diff(ctx, sn.ID, p.Name)
			if err != nil {
				t.Fatal(err)
			}
			var got []protocol.DiffEntry
			for _, ch := range diff.Changes {
				if strings.HasPrefix(ch.Path, "/d/") {
					got = append(got, ch)
				}
			}
			want := []protocol.DiffEntry{
				{Path: "/d/add", Kind: "added", SizeBytes: 4},
				{Path: "/d/chm", Kind: "modified", SizeBytes: 2},
				{Path: "/d/del", Kind: "deleted", SizeBytes: 2},
				{Path: "/d/mod", Kind: "modified", SizeBytes: 5},
				{Path: "/d/old", Kind: "deleted", SizeBytes: 2},
				{Path: "/d/renamed", Kind: "added", SizeBytes: 2},
				{Path: "/d/sub", Kind: "deleted"},
				{Path: "/d/sub/f", Kind: "deleted", SizeBytes: 2},
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("diff:\n got %+v\nwant %+v\n all %+v", got, want, diff.Changes)
			}
			// The reverse direction swaps adds and deletes.
			rev, err := c.Diff(ctx, p.Name, sn.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range rev.Changes {
				if ch.Path == "/d/add" && ch.Kind != "deleted" || ch.Path == "/d/del" && ch.Kind != "added" {
					t.Fatalf("reverse diff: %+v", rev.Changes)
				}
			}

			r, err := c.ResetSandbox(ctx, p.Name, sn.ID)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != protocol.StatusReady || r.SnapshotID != sn.ID {
				t.Fatalf("after reset: %+v", r)
			}
			if got := mustRun(t, c, p.Name, "cat /d/mod /d/old; test -e /d/add && echo LEAK; true"); got != "1234\nr\n" {
				t.Fatalf("after reset sees %q", got)
			}
			// Reset to the image snapshot: an empty upper.
			if _, err := c.ResetSandbox(ctx, p.Name, base.ID); err != nil {
				t.Fatal(err)
			}
			if got := mustRun(t, c, p.Name, "test -e /d && echo LEAK; true"); got != "" {
				t.Fatalf("after reset to base sees %q", got)
			}
		})
	}
}

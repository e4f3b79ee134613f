package mounts

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/mounts/mountstest"
)

// crash ends sandbox id's mounts as the daemon's death would: the FUSE
// servers go, nothing is flushed.
func crash(svc *Service, id string) {
	svc.mu.Lock()
	sv := svc.byID[id]
	delete(svc.byID, id)
	svc.mu.Unlock()
	for _, l := range sv.mounts {
		detach(l.mnt)
		l.server.Wait()
	}
}

// TestS3MountJournal: writes still waiting for their write-back when the
// daemon dies are uploaded, under the names they had last, when the mount
// is served again — before Up returns, and also after an Up that failed
// first. Removed files are not.
func TestS3MountJournal(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	srv.Put(t, "bkt", "old.txt", []byte("old"))
	cfg := s3Config(srv, "bkt", `,"cache":{"writeback_seconds":600}`)
	dir := t.TempDir()
	svc, err := New(Options{AllowLoopback: true, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	binds, err := svc.Up(context.Background(), "sb1", "ws", cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	mnt := binds[0].Source
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(mnt, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rename := func(from, to string) {
		t.Helper()
		if err := os.Rename(filepath.Join(mnt, from), filepath.Join(mnt, to)); err != nil {
			t.Fatal(err)
		}
	}
	write("a.txt", "alpha")
	write("old.txt", "replaced") // O_TRUNC of an object
	write("tmp.txt", "moved")
	rename("tmp.txt", "moved.txt")
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	write("d/x.txt", "in a dir")
	rename("d", "e")
	write("gone.txt", "never stored")
	if err := os.Remove(filepath.Join(mnt, "gone.txt")); err != nil {
		t.Fatal(err)
	}
	wantNoObject(t, srv, "a.txt")
	// Truncating old.txt while its fill ran did not count as a failure.
	if h := svc.Health("sb1"); h != "mounts: /data (s3) ok" {
		t.Fatalf("health = %q", h)
	}
	crash(svc, "sb1")

	// A new daemon whose first Up fails (a wrong key) keeps the pending
	// writes for the next.
	svc2, err := New(Options{AllowLoopback: true, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	bad := *srv
	bad.SecretKey = "wrong"
	if _, err := svc2.Up(context.Background(), "sb1", "ws", s3Config(&bad, "bkt", `,"cache":{"writeback_seconds":600}`), nil); err == nil {
		t.Fatal("Up with a wrong key succeeded")
	}
	if _, err := svc2.Up(context.Background(), "sb1", "ws", cfg, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc2.Remove(context.Background(), "sb1") })
	for key, want := range map[string]string{"a.txt": "alpha", "old.txt": "replaced", "moved.txt": "moved", "e/x.txt": "in a dir"} {
		if b, ok := srv.Get(t, "bkt", key); !ok || string(b) != want {
			t.Errorf("%s in the bucket once Up returned = %q (present %v), want %q", key, b, ok, want)
		}
	}
	for _, key := range []string{"tmp.txt", "d/x.txt", "gone.txt"} {
		wantNoObject(t, srv, key)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "sb1", "0", "journal")); len(entries) != 0 {
		t.Fatalf("journal entries left after the replay: %v", entries)
	}
}

// TestS3MountNoJournalAtClose: with writeback_seconds 0 a file is stored
// when closed; one still open is not journaled (a crash leaves nothing
// half-written to publish).
func TestS3MountNoJournalAtClose(t *testing.T) {
	srv := mountstest.StartS3(t, "bkt")
	svc, mnt := upS3(t, s3Config(srv, "bkt", ""))
	f, err := os.Create(filepath.Join(mnt, "open.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("half"); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(filepath.Join(svc.opt.Dir, "sb1", "0", "journal")); err != nil || len(entries) != 0 {
		t.Fatalf("journal of a writeback-0 mount: %v %v", entries, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantObject(t, srv, "open.txt", "half")
}

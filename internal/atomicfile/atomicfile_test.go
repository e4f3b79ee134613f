package atomicfile

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}

func TestWriteFileReplacesWithExactMode(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "state.json")
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	for _, data := range []string{"first", "second, longer"} {
		if err := WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != data {
			t.Fatalf("read back %q, %v; want %q", b, err, data)
		}
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 whatever the umask", fi.Mode().Perm())
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("dir holds %v, want only the file (no staging leftovers)", names)
	}
}

// TestWriteFailureKeepsOld: a fill that fails halfway leaves the old
// content, not a prefix of the new, and no staging file.
func TestWriteFailureKeepsOld(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "vault.json")
	if err := WriteFile(p, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(p, 0o600, func(w io.Writer) error {
		w.Write([]byte("half of the new"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want fill's error", err)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Errorf("after a failed write the file holds %q, want the old content", b)
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("dir holds %v after a failed write", names)
	}
}

func TestWithTempDirStagesElsewhere(t *testing.T) {
	dir, tmp := t.TempDir(), t.TempDir()
	p := filepath.Join(dir, "ref")
	err := Write(p, 0o600, func(w io.Writer) error {
		if names := entries(t, dir); len(names) != 0 {
			t.Errorf("listed dir holds %v while staging", names)
		}
		if names := entries(t, tmp); len(names) != 1 {
			t.Errorf("temp dir holds %v while staging, want the staging file", names)
		}
		_, err := w.Write([]byte("x"))
		return err
	}, WithTempDir(tmp))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "x" {
		t.Errorf("file holds %q", b)
	}
}

// TestCreateOnce: of racing Creates exactly one wins, the file is always
// whole (never an empty or partial key), and a later Create keeps it.
func TestCreateOnce(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "key")
	key := bytes.Repeat([]byte("k"), 1<<16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			created, err := Create(p, append(key[:len(key)-1:len(key)-1], byte('0'+i)), 0o600)
			if err != nil {
				t.Error(err)
			}
			if created {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
		go func() {
			defer wg.Done()
			if b, err := os.ReadFile(p); err == nil && len(b) != len(key) {
				t.Errorf("a reader saw %d bytes of a %d-byte file", len(b), len(key))
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d Creates won, want 1", wins)
	}
	first, _ := os.ReadFile(p)
	if created, err := Create(p, []byte("other"), 0o600); err != nil || created {
		t.Fatalf("Create over an existing file = %v, %v", created, err)
	}
	if b, _ := os.ReadFile(p); !bytes.Equal(b, first) {
		t.Error("Create over an existing file changed it")
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	if names := entries(t, dir); len(names) != 1 {
		t.Errorf("dir holds %v, want only the key", names)
	}
}

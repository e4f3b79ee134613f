package secrets

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestKeyFileCreatedOnceWithMode0600(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.key")
	b1, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 || st.Size() != KeySize {
		t.Fatalf("key file mode %v size %d, want 0600 and %d bytes", st.Mode().Perm(), st.Size(), KeySize)
	}
	key1, _ := os.ReadFile(path)
	sealed, err := b1.Seal([]byte("hunter2"), "reg-1")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("sealed value contains the plaintext")
	}
	// A second load (a daemon restart) reuses the key and opens old values.
	b2, err := LoadOrCreate(path)
	if err != nil {
		t.Fatal(err)
	}
	if key2, _ := os.ReadFile(path); !bytes.Equal(key1, key2) {
		t.Fatal("key file rewritten on second load")
	}
	pt, err := b2.Open(sealed, "reg-1")
	if err != nil || string(pt) != "hunter2" {
		t.Fatalf("open after reload: %q %v", pt, err)
	}
}

func TestOpenRefusesOtherRecordTamperingAndOtherKey(t *testing.T) {
	dir := t.TempDir()
	b, err := LoadOrCreate(filepath.Join(dir, "a.key"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := LoadOrCreate(filepath.Join(dir, "b.key"))
	if err != nil {
		t.Fatal(err)
	}
	sealed, _ := b.Seal([]byte("pw"), "reg-1")
	if _, err := b.Open(sealed, "reg-2"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with another record's ad: %v, want ErrCorrupt", err)
	}
	bad := append([]byte(nil), sealed...)
	bad[len(bad)-1] ^= 1
	if _, err := b.Open(bad, "reg-1"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open tampered: %v, want ErrCorrupt", err)
	}
	if _, err := other.Open(sealed, "reg-1"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with another key: %v, want ErrCorrupt", err)
	}
	s2, _ := b.Seal([]byte("pw"), "reg-1")
	if bytes.Equal(sealed, s2) {
		t.Fatal("two seals of the same value are identical (nonce reuse)")
	}
}

func TestLoadRefusesLooseKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(path, bytes.Repeat([]byte{7}, KeySize), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(path); err == nil {
		t.Fatal("a world-readable key file was accepted")
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), "short.key"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreate(filepath.Join(filepath.Dir(path), "short.key")); err == nil {
		t.Fatal("a short key file was accepted")
	}
}

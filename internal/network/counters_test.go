package network

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadCountersSwapsDirections(t *testing.T) {
	dir := t.TempDir()
	stats := filepath.Join(dir, "cbx", "statistics")
	if err := os.MkdirAll(stats, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stats, "rx_bytes"), []byte("100\n"), 0o644)
	os.WriteFile(filepath.Join(stats, "tx_bytes"), []byte("250\n"), 0o644)
	got, err := readCounters(dir, "cbx")
	if want := (Counters{RxBytes: 250, TxBytes: 100}); err != nil || got != want {
		t.Fatalf("readCounters = %+v, %v; want %+v", got, err, want)
	}
	if _, err := readCounters(dir, "nope"); err == nil {
		t.Error("readCounters of a missing interface: no error")
	}
}

package blueprint

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestBuiltCache: a kept build is found by its key with its packages; a
// tarball that no longer matches its digest, or one older than
// maxBuiltAge, is dropped and not found; beyond keepBuilt entries the
// least recently used go, tarball and all; of tarballs no entry names,
// only old ones go.
func TestBuiltCache(t *testing.T) {
	b := &Builder{CacheDir: t.TempDir()}
	keep := func(key, content string) string {
		t.Helper()
		src := filepath.Join(t.TempDir(), "rootfs.tar")
		if err := os.WriteFile(src, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		kept, err := b.keepBuilt(key, src, map[string]string{"bash": "5.2"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(src); !os.IsNotExist(err) {
			t.Errorf("the build's tarball is still there after it was kept: %v", err)
		}
		return kept
	}
	kept := keep("k1", "root filesystem")
	tarball, pkgs, ok := b.lookupBuilt("k1")
	if !ok || tarball != kept || pkgs["bash"] != "5.2" {
		t.Fatalf("lookup k1 = %q %v %v; want %q with bash", tarball, pkgs, ok, kept)
	}
	if data, err := os.ReadFile(tarball); err != nil || string(data) != "root filesystem" {
		t.Fatalf("cached tarball %q %v", data, err)
	}
	if _, _, ok := b.lookupBuilt("absent"); ok {
		t.Fatal("an absent key was found")
	}

	if err := os.WriteFile(tarball, []byte("root filesystenn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := b.lookupBuilt("k1"); ok {
		t.Fatal("a damaged tarball was found")
	}
	if _, err := os.Stat(tarball); !os.IsNotExist(err) {
		t.Errorf("a damaged tarball stays: %v", err)
	}

	old := keep("k2", "old build")
	then := time.Now().Add(-maxBuiltAge - time.Hour)
	if err := os.Chtimes(old, then, then); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := b.lookupBuilt("k2"); ok {
		t.Fatal("a build older than maxBuiltAge was found")
	}

	for i := range keepBuilt + 2 {
		keep(fmt.Sprintf("n%d", i), "build")
		at := time.Now().Add(time.Duration(i-keepBuilt-2) * time.Minute) // n0 used longest ago
		if err := os.Chtimes(filepath.Join(b.builtDir(), fmt.Sprintf("n%d.json", i)), at, at); err != nil {
			t.Fatal(err)
		}
	}
	keep("last", "build") // prunes
	for i := range keepBuilt + 2 {
		_, _, ok := b.lookupBuilt(fmt.Sprintf("n%d", i))
		if want := i >= 3; ok != want {
			t.Errorf("n%d found = %v; want %v (the %d most recently used stay)", i, ok, want, keepBuilt)
		}
	}
	if _, err := os.Stat(filepath.Join(b.builtDir(), "n0.tar")); !os.IsNotExist(err) {
		t.Errorf("a pruned entry's tarball stays: %v", err)
	}

	// Tarballs no entry names: a fresh one may be another daemon's between
	// its two writes and stays; an old one is removed.
	fresh, stale := filepath.Join(b.builtDir(), "fresh.tar"), filepath.Join(b.builtDir(), "stale.tar")
	for _, p := range []string{fresh, stale} {
		if err := os.WriteFile(p, []byte("orphan"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(stale, then, then); err != nil {
		t.Fatal(err)
	}
	keep("after", "build")
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh orphan tarball was removed: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("an old orphan tarball stays: %v", err)
	}
}

// TestProgressStacked: a stacked build's base reports into the first
// part of the whole and the stacked recipe into the rest, each starting
// with apt's update again.
func TestProgressStacked(t *testing.T) {
	var got []int
	r := newReporter(func(p Progress) { got = append(got, p.Percent) })
	outer := r.within(func(s span) span { return s.part(0, 60) })
	r.aptStatus(installMarker) // base: 30% of 60
	r.set("packed", 97)        // 58
	r.within(func(span) span { return outer.part(60, 100) })
	r.aptStatus("dlstatus:1:100:Retrieving file 1 of 1") // an update's again: 30% of the rest
	r.set("packed", 97)
	want := []int{18, 58, 72, 98}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("stacked progress %v; want %v", got, want)
	}
}

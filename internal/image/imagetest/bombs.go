package imagetest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"testing"
)

// SparseBombTar is a tar of one GNU sparse file ("bomb") whose logical
// size is realSize but which carries no data at all: a few blocks that a
// naive unpacker turns into realSize bytes of zeros on disk.
func SparseBombTar(t testing.TB, realSize int64) []byte {
	t.Helper()
	h := make([]byte, 512)
	octal := func(off, n int, v int64) {
		copy(h[off:off+n], fmt.Sprintf("%0*o\x00", n-1, v))
	}
	copy(h[0:], "bomb")
	octal(100, 8, 0o644)         // mode
	octal(108, 8, 0)             // uid
	octal(116, 8, 0)             // gid
	octal(124, 12, 0)            // stored size: no data
	octal(136, 12, 0)            // mtime
	h[156] = tar.TypeGNUSparse   // typeflag 'S'
	copy(h[257:], "ustar  \x00") // GNU magic + version
	octal(386, 12, realSize)     // sparse[0].offset: one empty extent at the end
	octal(398, 12, 0)            // sparse[0].numbytes
	octal(483, 12, realSize)     // realsize
	copy(h[148:156], "        ") // checksum is computed over spaces
	var sum int64
	for _, b := range h {
		sum += int64(b)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	var buf bytes.Buffer
	buf.Write(h)
	buf.Write(make([]byte, 1024)) // end of archive
	return buf.Bytes()
}

// ZerosTar is a tar of one regular file of n zero bytes, which gzip
// compresses about a thousandfold: a gzip bomb once it is a layer.
func ZerosTar(t testing.TB, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: "zeros", Mode: 0o644, Size: n, Typeflag: tar.TypeReg, ModTime: Epoch}); err != nil {
		t.Fatalf("imagetest: zeros header: %v", err)
	}
	chunk := make([]byte, 1<<20)
	for left := n; left > 0; {
		k := min(left, int64(len(chunk)))
		if _, err := tw.Write(chunk[:k]); err != nil {
			t.Fatalf("imagetest: zeros: %v", err)
		}
		left -= k
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("imagetest: zeros: %v", err)
	}
	return buf.Bytes()
}

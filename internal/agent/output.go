package agent

import "unicode/utf8"

// outBuf is one output stream of a command: a bounded window of its bytes,
// addressed by absolute stream offset. Invariants: buf holds bytes
// [base, base+len(buf)); base only grows; the end of buf is always at a UTF-8
// boundary in a text session unless the stream itself contained invalid
// bytes, because the producer holds back an incomplete trailing sequence
// (see completePrefix); a binary session's buf is bytes as they came.
type outBuf struct {
	base int64
	buf  []byte
	max  int
}

// end is the offset one past the last byte written.
func (b *outBuf) end() int64 { return b.base + int64(len(b.buf)) }

// write appends p, dropping the oldest bytes beyond max.
func (b *outBuf) write(p []byte) {
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = b.buf[over:]
		b.base += int64(over)
		if cap(b.buf) > 2*b.max { // let a long-running stream's array shrink
			b.buf = append([]byte(nil), b.buf...)
		}
	}
}

// from returns up to limit bytes starting at off (or at the earliest byte
// still held, if off is older), cut so no UTF-8 sequence is split unless
// raw, and the offset of the first returned byte. It returns nil when
// nothing at or after off is available yet.
func (b *outBuf) from(off int64, limit int, raw bool) ([]byte, int64) {
	if off < b.base {
		off = b.base
		// The window may start mid-character; text skips to the next boundary.
		for i := 0; !raw && i < utf8.UTFMax && int(off-b.base) < len(b.buf) && !utf8.RuneStart(b.buf[off-b.base]); i++ {
			off++
		}
	}
	if off >= b.end() {
		return nil, off
	}
	p := b.buf[off-b.base:]
	if len(p) > limit {
		p = p[:limit]
		if n := completePrefix(p); n > 0 && !raw {
			p = p[:n]
		}
	}
	return p, off
}

// completePrefix returns the length of p without an incomplete trailing
// UTF-8 sequence. Invalid bytes are not held back: they can never complete.
func completePrefix(p []byte) int {
	n := len(p)
	for i := n - 1; i >= 0 && i >= n-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			if !utf8.FullRune(p[i:]) {
				return i
			}
			return n
		}
	}
	return n
}

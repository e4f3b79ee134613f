package record

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestLiteralChunksMatchDecoded feeds the same stream as JSON literals
// (what the WebSocket relay sees) and as decoded bytes, with a reconnect's
// replay in the middle, and checks both captures keep the same head, tail
// and total, while holding only about the last half undecoded.
func TestLiteralChunksMatchDecoded(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "b", "\n", `"`, `\`, "é", "<", "\x01", "xyz"}
	for _, limit := range []int{8, 64, 1000} {
		lit, dec := newCapture(limit), newCapture(limit)
		var chunks []chunk
		var off int64
		var all bytes.Buffer
		for range 200 {
			var b bytes.Buffer
			for range rng.IntN(40) {
				b.WriteString(alphabet[rng.IntN(len(alphabet))])
			}
			l, _ := json.Marshal(b.String())
			chunks = append(chunks, chunk{off: off, lit: l})
			all.Write(b.Bytes())
			off += int64(b.Len())
		}
		maxHeld := 0
		for i, k := range chunks {
			lit.add(k)
			if i == 150 { // a reconnect replays from chunk 120
				for _, r := range chunks[120 : i+1] {
					lit.add(r)
				}
			}
			maxHeld = max(maxHeld, len(lit.pending))
		}
		dec.writeAt(0, all.Bytes())
		lit.settle()
		if !bytes.Equal(lit.head, dec.head) || !bytes.Equal(lit.tailBytes(), dec.tailBytes()) || lit.total != dec.total || lit.truncated() != dec.truncated() {
			t.Fatalf("limit %d: literal capture head %q tail %q total %d; decoded head %q tail %q total %d",
				limit, lit.head, lit.tailBytes(), lit.total, dec.head, dec.tailBytes(), dec.total)
		}
		if maxHeld > limit/2+2 {
			t.Fatalf("limit %d: held %d undecoded chunks", limit, maxHeld)
		}
	}
}

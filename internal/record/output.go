package record

import (
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// DefaultOutputCap is the bytes of each output stream a command's record
// keeps by default: the first half and the last half of what it wrote.
const DefaultOutputCap = 1 << 20

// capture keeps the head and tail of one output stream, cap/2 bytes each,
// and counts every byte. Offsets make it idempotent over replays: a
// reconnecting client asks the agent for output again from its own offset,
// and only bytes past what was already counted are new. Not safe for
// concurrent use (its Command serialises it).
type capture struct {
	half     int
	head     []byte
	headDone bool   // a gap was skipped: head no longer grows
	tail     []byte // ring of the last half bytes once head is full
	start    int    // index of the oldest byte in tail
	total    int64
	pending  []chunk // undecoded output past the head (chunks.go)
}

func newCapture(limit int) *capture { return &capture{half: max(limit/2, 1)} }

// writeAt adds p, whose first byte is at offset off of the stream.
func (c *capture) writeAt(off int64, p []byte) {
	if end := off + int64(len(p)); end <= c.total {
		return
	} else if off < c.total {
		p = p[c.total-off:]
	} else if off > c.total {
		// Bytes the daemon never saw (a client resumed past them): they
		// count, but are not kept.
		c.skip(off - c.total)
	}
	c.total += int64(len(p))
	if room := c.half - len(c.head); room > 0 && !c.headDone {
		n := min(room, len(p))
		c.head = append(c.head, p[:n]...)
		p = p[n:]
	}
	c.appendTail(p)
}

// skip records n bytes of the stream that were never seen: the tail no
// longer joins the head.
func (c *capture) skip(n int64) {
	c.total += n
	c.headDone = true
	c.tail, c.start = c.tail[:0], 0
}

func (c *capture) appendTail(p []byte) {
	if len(p) >= c.half {
		c.tail = append(c.tail[:0], p[len(p)-c.half:]...)
		c.start = 0
		return
	}
	if len(c.tail) < c.half {
		if n := min(c.half-len(c.tail), len(p)); n > 0 {
			c.tail = append(c.tail, p[:n]...)
			p = p[n:]
		}
	}
	for len(p) > 0 {
		n := copy(c.tail[c.start:], p)
		p = p[n:]
		c.start = (c.start + n) % len(c.tail)
	}
}

// tailBytes is the tail in stream order.
func (c *capture) tailBytes() []byte {
	out := make([]byte, 0, len(c.tail))
	return append(append(out, c.tail[c.start:]...), c.tail[:c.start]...)
}

// truncated reports whether bytes between head and tail were dropped.
func (c *capture) truncated() bool {
	return c.total > int64(len(c.head)+len(c.tail))
}

// output is the capture as stored for stream of sandboxID's step.
func (c *capture) output(sandboxID string, step int64, stream string) store.AuditOutput {
	return store.AuditOutput{SandboxID: sandboxID, Step: step, Stream: stream,
		Head: c.head, Tail: c.tailBytes(), TotalBytes: c.total, Truncated: c.truncated()}
}

// wireOutput is a stored stream as the API returns it.
func wireOutput(o store.AuditOutput) *protocol.CommandOutput {
	return &protocol.CommandOutput{Head: string(o.Head), Tail: string(o.Tail), TotalBytes: o.TotalBytes, Truncated: o.Truncated}
}

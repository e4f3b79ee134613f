package record

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
)

// Output relayed over the WebSocket exec path arrives as JSON string
// literals in the agent's frames. Decoding every one would cost the relay
// more than relaying it (encoding/json decodes ~200 MB/s), so a capture
// decodes only what it keeps: chunks are decoded at once while the head
// fills, and after that held undecoded — only as many as cover the last
// half bytes, their decoded lengths known from the next chunk's offset —
// until the command ends.

// chunk is output at stream offset off: a JSON string literal (lit) of
// text, or of base64 when b64, or bytes already decoded (data).
type chunk struct {
	off  int64
	lit  []byte
	b64  bool
	data []byte
}

// bytes is the chunk's decoded output; a literal that does not decode
// counts as empty.
func (k chunk) bytes() []byte {
	if k.lit == nil {
		return k.data
	}
	text := literalText(k.lit)
	if !k.b64 || text == nil {
		return text
	}
	b, err := base64.StdEncoding.AppendDecode(nil, text)
	if err != nil {
		return nil
	}
	return b
}

// literalText is what JSON string literal lit holds, nil if it is none.
func literalText(lit []byte) []byte {
	if len(lit) >= 2 && bytes.IndexByte(lit, '\\') < 0 {
		return lit[1 : len(lit)-1] // no escapes: the literal is the text
	}
	var s string
	if json.Unmarshal(lit, &s) != nil {
		return nil
	}
	return []byte(s)
}

// add takes chunk k of the stream. Replays (a reconnect asking for output
// again) replace what they overlap.
func (c *capture) add(k chunk) {
	for len(c.pending) > 0 && c.pending[len(c.pending)-1].off >= k.off {
		c.pending = c.pending[:len(c.pending)-1] // re-sent: the replay has it
	}
	if len(c.pending) == 0 && (c.total < int64(c.half) && !c.headDone || k.off < c.total) {
		c.writeAt(k.off, k.bytes()) // filling the head, or a replay of decoded bytes
		return
	}
	c.pending = append(c.pending, k)
	// pending[1:] covering the last half bytes makes pending[0] useless.
	for len(c.pending) >= 2 && k.off-c.pending[1].off >= int64(c.half) {
		c.pending[0] = chunk{}
		c.pending = c.pending[1:]
	}
}

// settle decodes the held chunks into the capture: once a command ends,
// and before its totals are read.
func (c *capture) settle() {
	for _, k := range c.pending {
		c.writeAt(k.off, k.bytes())
	}
	c.pending = nil
}

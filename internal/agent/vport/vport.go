// Package vport carries the daemon↔agent API over a microVM's
// virtio-serial port instead of TCP to the sandbox's address: the agent's
// port is then reachable from the host only, through QEMU's chardev
// socket, never from the sandbox's network.
//
// A port is one byte stream that outlives the connections to it: the host
// end reconnects (a daemon restart, a session that broke) while the guest
// keeps the port open, and bytes of an earlier connection may still be in
// flight either way. So each host connection begins with a handshake that
// both ends find by scanning, skipping whatever came before: the host sends
// hello with a fresh random nonce, the guest answers ready with it (once
// per nonce), the host sends start with it, and the session's bytes follow
// each side's last line. A hello answered after its connection was given
// up never starts a session, as its start never comes. Then a yamux
// session runs over the stream, and each of its streams is one connection
// of the agent's HTTP API.
package vport

import (
	"bytes"
	"io"
	"time"

	"github.com/hashicorp/yamux"
)

// FDEnv is the agent's environment variable that names its inherited
// port's file descriptor: with it set, the agent serves on the port and
// listens on no TCP address.
const FDEnv = "CUBICLE_AGENT_PORT_FD"

const (
	helloPrefix = "\nCUBICLE-VPORT-HELLO "
	readyPrefix = "\nCUBICLE-VPORT-READY "
	startPrefix = "\nCUBICLE-VPORT-START "
	nonceLen    = 32 // hex digits
	// maxLine bounds what a scan keeps of the stream while it looks for
	// a handshake line.
	maxLine = 256
)

// reset is what the guest writes when its session ends while the host is
// still connected: an invalid yamux version byte, so the host's session
// fails at once and it reconnects, instead of waiting for a keepalive.
var reset = bytes.Repeat([]byte{0xff}, 12)

// config is both ends' yamux configuration. Keepalives find a session
// whose other end went away without the stream saying so; a stream whose
// open is not acknowledged within StreamOpenTimeout ends its session.
func config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 10 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	// Uploads and command output move in windows of this size: 1 MiB
	// per stream keeps a virtio-serial port busy.
	c.MaxStreamWindowSize = 1 << 20
	return c
}

// scanner finds handshake lines (one of prefixes, nonceLen hex digits,
// newline) in a byte stream fed to it piece by piece.
type scanner struct {
	prefixes []string
	line     []byte
	prefix   string // of the last line found
}

// feed scans b; it returns the nonce and the bytes after its line once
// one is found (s.prefix says which). A nonce must be nonceLen lowercase
// hex digits.
func (s *scanner) feed(b []byte) (nonce string, rest []byte, ok bool) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.line = append(s.line, b...)
			if len(s.line) > maxLine {
				s.line = append(s.line[:0], s.line[len(s.line)-maxLine:]...)
			}
			return "", nil, false
		}
		s.line = append(s.line, b[:i+1]...)
		b = b[i+1:]
		// A prefix begins with a newline: it is looked for in the line
		// with the previous line's end.
		for _, p := range s.prefixes {
			if n, found := bytes.CutPrefix(s.line, []byte(p)); found && validNonce(n[:len(n)-1]) {
				s.prefix = p
				s.line = append(s.line[:0], '\n')
				return string(n[:len(n)-1]), b, true
			}
		}
		s.line = append(s.line[:0], '\n')
	}
	return "", nil, false
}

// reset forgets a partial line: the stream it was part of ended.
func (s *scanner) reset() { s.line = s.line[:0] }

func validNonce(n []byte) bool {
	if len(n) != nonceLen {
		return false
	}
	for _, c := range n {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

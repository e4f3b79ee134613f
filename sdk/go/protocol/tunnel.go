package protocol

import (
	"io"
	"net"
	"sync"
)

// TCP tunnels (spec additions, "TCP Tunnel"): a WebSocket to
// <dataplane>/tunnel whose binary messages carry a yamux session. The
// client opens one yamux stream per TCP connection; each stream starts with
// a connect header (TunnelVersion, then the port inside the sandbox as a
// big-endian uint16) and gets one status byte back before the raw bytes of
// the connection flow both ways.
const (
	TunnelVersion = 0x01
	// TunnelHeaderLen is the length of the connect header.
	TunnelHeaderLen = 3
)

// Tunnel status bytes.
const (
	TunnelOK                 = 0x00
	TunnelPortNotAllowed     = 0x01
	TunnelDialFailed         = 0x02
	TunnelUnsupportedVersion = 0x03
)

// TunnelRelay copies a and b into each other until both directions end,
// passing each side's end of input on as a half-close where the
// connection has one (CloseWrite; a yamux stream's Close is one), so a
// protocol that closes its writing side still gets its answer.
func TunnelRelay(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	one := func(dst, src net.Conn) {
		defer wg.Done()
		io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	go one(a, b)
	go one(b, a)
	wg.Wait()
}

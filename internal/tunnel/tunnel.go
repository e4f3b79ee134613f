// Package tunnel serves TCP tunnels into a sandbox (the protocol is in
// sdk/go/protocol/tunnel.go): a yamux server session over a WebSocket,
// each stream of which the daemon connects to a port at the sandbox's own
// address, never anywhere else.
//
// Every stream is bounded by yamux's flow control (a stream's window, so a
// slow reader slows its writer, never the session's other streams) and by
// a connect-header deadline; the session ends when the WebSocket closes,
// the context ends (the sandbox stopped or was deleted), or keepalives
// fail.
package tunnel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/hashicorp/yamux"
)

// Config says where and whether a stream may connect.
type Config struct {
	// Dial connects to port at the sandbox's address.
	Dial func(ctx context.Context, port uint16) (net.Conn, error)
	// Allowed reports whether a stream may connect to port (the agent's
	// port, for one, is not).
	Allowed func(port uint16) bool
	// MaxStreams bounds the streams open at once (default 256); a stream
	// beyond it is refused by yamux.
	MaxStreams int
	Log        *slog.Logger
}

// headerTimeout bounds how long an opened stream may take to send its
// connect header.
const headerTimeout = 10 * time.Second

// dialTimeout bounds a connection attempt inside the sandbox.
const dialTimeout = 10 * time.Second

// MaxWindow is a stream's largest receive window, and so (with yamux's
// 12-byte frame header) the largest message a peer sends: a WebSocket
// carrying a session must accept messages this large.
const MaxWindow = 4 << 20

// SessionConfig is the yamux configuration of both ends: keepalives on, a
// stream window large enough for a fast loopback peer (yamux's 256 KiB
// default caps a stream at a few hundred MB/s of round trips).
func SessionConfig(maxStreams int) *yamux.Config {
	c := yamux.DefaultConfig()
	c.MaxStreamWindowSize = MaxWindow
	c.LogOutput = io.Discard
	if maxStreams > 0 {
		c.AcceptBacklog = maxStreams
	}
	return c
}

// Serve runs a tunnel session over conn until ctx ends or the session
// does, then closes every stream and conn.
func Serve(ctx context.Context, conn net.Conn, cfg Config) error {
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = 256
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	sess, err := yamux.Server(conn, SessionConfig(cfg.MaxStreams))
	if err != nil {
		conn.Close()
		return fmt.Errorf("tunnel: start session: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-ctx.Done():
		case <-sess.CloseChan():
		}
		sess.Close()
	}()
	var wg sync.WaitGroup
	err = accept(ctx, sess, cfg, &wg)
	cancel() // ends every stream's relay
	wg.Wait()
	return err
}

// accept serves sess's streams, at most cfg.MaxStreams at once, until the
// session ends.
func accept(ctx context.Context, sess *yamux.Session, cfg Config, wg *sync.WaitGroup) error {
	slots := make(chan struct{}, cfg.MaxStreams)
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			// The session's end by either side, or by ctx (whose
			// WebSocket then fails its writes first), is a normal end.
			if ctx.Err() != nil || errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("tunnel: accept stream: %w", err)
		}
		select {
		case slots <- struct{}{}:
		default:
			st.Close() // over MaxStreams: refuse rather than queue
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			serveStream(ctx, st, cfg)
		}()
	}
}

// serveStream reads st's connect header, connects, answers the status and
// relays until either side is done.
func serveStream(ctx context.Context, st *yamux.Stream, cfg Config) {
	defer st.Close()
	var hdr [protocol.TunnelHeaderLen]byte
	st.SetReadDeadline(time.Now().Add(headerTimeout))
	if _, err := io.ReadFull(st, hdr[:]); err != nil {
		return
	}
	st.SetReadDeadline(time.Time{})
	if hdr[0] != protocol.TunnelVersion {
		st.Write([]byte{protocol.TunnelUnsupportedVersion})
		return
	}
	port := binary.BigEndian.Uint16(hdr[1:])
	if port == 0 || cfg.Allowed != nil && !cfg.Allowed(port) {
		st.Write([]byte{protocol.TunnelPortNotAllowed})
		return
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	c, err := cfg.Dial(dctx, port)
	cancel()
	if err != nil {
		cfg.Log.DebugContext(ctx, "tunnel dial", "port", port, "err", err)
		st.Write([]byte{protocol.TunnelDialFailed})
		return
	}
	defer c.Close()
	// The session's end (a stop, a delete, the client gone) ends the relay
	// whatever either peer is doing.
	stop := context.AfterFunc(ctx, func() { c.Close(); st.Close() })
	defer stop()
	if _, err := st.Write([]byte{protocol.TunnelOK}); err != nil {
		return
	}
	protocol.TunnelRelay(st, c)
}

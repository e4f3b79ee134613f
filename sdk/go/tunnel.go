package cubicle

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/hashicorp/yamux"
)

// tunnelMaxMessage bounds one WebSocket message of a tunnel: a yamux frame
// of at most the daemon's stream window (internal/tunnel.MaxWindow) plus
// its header.
const tunnelMaxMessage = 4<<20 + 64

// Tunnel is a TCP tunnel session into one sandbox: every Dial is a new
// connection to a port inside it, multiplexed over one WebSocket. Safe for
// concurrent use. The sandbox counts as active while a tunnel is open.
type Tunnel struct {
	sess *yamux.Session
}

// TunnelError is a connection the daemon refused (one of the protocol's
// Tunnel* statuses).
type TunnelError struct {
	Port   int
	Status byte
}

func (e *TunnelError) Error() string {
	why := map[byte]string{
		protocol.TunnelPortNotAllowed:     "port not allowed",
		protocol.TunnelDialFailed:         "nothing accepts connections on that port inside the sandbox",
		protocol.TunnelUnsupportedVersion: "tunnel protocol version not supported by the daemon",
	}[e.Status]
	if why == "" {
		why = fmt.Sprintf("status %d", e.Status)
	}
	return fmt.Sprintf("tunnel to port %d: %s", e.Port, why)
}

// OpenTunnel opens a tunnel session into the sandbox called name (waking
// it if it is stopped).
func (c *Client) OpenTunnel(ctx context.Context, name string) (*Tunnel, error) {
	dp, err := c.dataplaneURL(ctx, name)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set("X-Api-Key", c.apiKey)
	h.Set("User-Agent", "cubicle-go")
	ws, resp, err := websocket.Dial(ctx, dp+"/tunnel", &websocket.DialOptions{HTTPClient: c.http, HTTPHeader: h})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body, _ := io.ReadAll(resp.Body)
			return nil, fmt.Errorf("open tunnel to %s: %w", name, parseError(resp.StatusCode, body))
		}
		return nil, fmt.Errorf("open tunnel to %s: %w", name, err)
	}
	ws.SetReadLimit(tunnelMaxMessage)
	// The session outlives ctx (which only bounds the handshake).
	conn := websocket.NetConn(context.Background(), ws, websocket.MessageBinary)
	cfg := yamux.DefaultConfig()
	cfg.MaxStreamWindowSize = tunnelMaxMessage - 64
	cfg.LogOutput = io.Discard
	sess, err := yamux.Client(conn, cfg)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open tunnel to %s: %w", name, err)
	}
	return &Tunnel{sess: sess}, nil
}

// Dial connects to port inside the sandbox. A refusal is a *TunnelError.
func (t *Tunnel) Dial(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("tunnel: port %d out of range", port)
	}
	st, err := t.sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("tunnel: open stream: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok {
		st.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	hdr := []byte{protocol.TunnelVersion, 0, 0}
	binary.BigEndian.PutUint16(hdr[1:], uint16(port))
	var status [1]byte
	if _, err = st.Write(hdr); err == nil {
		_, err = io.ReadFull(st, status[:])
	}
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("tunnel to port %d: %w", port, err)
	}
	st.SetDeadline(time.Time{})
	if status[0] != protocol.TunnelOK {
		st.Close()
		return nil, &TunnelError{Port: port, Status: status[0]}
	}
	return st, nil
}

// Forward accepts connections on ln and relays each to port inside the
// sandbox (like `kubectl port-forward`) until ctx ends, ln fails or the
// tunnel closes. A connection the daemon refuses is closed and reported
// through onError, if set.
func (t *Tunnel) Forward(ctx context.Context, ln net.Listener, port int, onError func(error)) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	go func() {
		<-t.sess.CloseChan()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || t.sess.IsClosed() || errors.Is(err, net.ErrClosed) {
				return ctx.Err()
			}
			return err
		}
		go func() {
			defer c.Close()
			st, err := t.Dial(ctx, port)
			if err != nil {
				if onError != nil {
					onError(err)
				}
				return
			}
			defer st.Close()
			protocol.TunnelRelay(c, st)
		}()
	}
}

// Close ends the session and every connection through it.
func (t *Tunnel) Close() error { return t.sess.Close() }

// Done is closed when the session ends (Close, or the daemon ended it: the
// sandbox stopped or was deleted).
func (t *Tunnel) Done() <-chan struct{} { return t.sess.CloseChan() }

package api

import (
	"net/http"

	"github.com/coder/websocket"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/tunnel"
)

// tunnelMessageLimit bounds one WebSocket message of a tunnel: a yamux
// frame of at most tunnel.MaxWindow plus its header.
const tunnelMessageLimit = tunnel.MaxWindow + 64

// openTunnel serves GET /dp/{id}/tunnel: a TCP tunnel session (spec
// additions) into the sandbox, which it wakes if stopped. The sandbox
// counts as active while the session is open; the session ends when the
// sandbox stops or is deleted.
func (s *Server) openTunnel(w http.ResponseWriter, r *http.Request) {
	dp, ok := s.dataplane(w, r, authz.Exec)
	if !ok {
		return
	}
	defer dp.Release()
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ws.SetReadLimit(tunnelMessageLimit)
	// The session ends with this instance of the sandbox.
	ctx, cancel := cancelOn(r.Context(), dp.Gone)
	defer cancel()
	conn := websocket.NetConn(ctx, ws, websocket.MessageBinary)
	err = tunnel.Serve(ctx, conn, tunnel.Config{Dial: dp.DialPort, Allowed: dp.PortAllowed, Log: s.log})
	if err != nil {
		s.log.DebugContext(ctx, "tunnel ended", "sandbox", r.PathValue("id"), "err", err)
	}
}

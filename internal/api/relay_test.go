package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// TestRelayAgentBreaks: when the agent's connection breaks (no close
// frame: its sandbox died) and the instance goes, the client is told why
// in a terminal error frame, so it neither hangs nor reconnects.
func TestRelayAgentBreaks(t *testing.T) {
	drop := make(chan struct{})
	agentSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		<-drop
		c.CloseNow() // the TCP connection ends without a close handshake
	}))
	defer agentSrv.Close()
	gone := make(chan struct{})
	relaySrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		up, _, err := websocket.Dial(r.Context(), "ws"+strings.TrimPrefix(agentSrv.URL, "http"), nil)
		if err != nil {
			client.Close(websocket.StatusInternalError, err.Error())
			return
		}
		relay(r.Context(), client, up, gone, func() {}, func() (string, bool) { return "sandbox exited unexpectedly", false }, nil)
	}))
	defer relaySrv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(relaySrv.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	close(drop)
	time.AfterFunc(50*time.Millisecond, func() { close(gone) }) // the watcher notices
	var f protocol.ExecFrame
	if err := wsjson.Read(ctx, c, &f); err != nil {
		t.Fatalf("client got no frame: %v", err)
	}
	if f.Type != protocol.FrameError || f.ErrorType != protocol.ErrCommandError || f.Error != "sandbox exited unexpectedly" {
		t.Fatalf("client got %+v, want the reason in an error frame", f)
	}
}

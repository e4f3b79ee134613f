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

// relayServer relays each client's exec connection to the agent at
// agentURL, ending with msg (and killing the command when kill) once gone
// closes.
func relayServer(agentURL string, gone <-chan struct{}, msg string, kill bool) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		client, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		up, _, err := websocket.Dial(r.Context(), "ws"+strings.TrimPrefix(agentURL, "http"), nil)
		if err != nil {
			client.Close(websocket.StatusInternalError, err.Error())
			return
		}
		relay(r.Context(), client, up, gone, func() {}, func() (string, bool) { return msg, kill }, nil)
	}))
}

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
	relaySrv := relayServer(agentSrv.URL, gone, "sandbox exited unexpectedly", false)
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

// TestRelayCutBeatsTheKilledExit: when access is cut, the relay kills the
// command and tells the client why; the exit frame the agent answers the
// kill with never reaches the client first (it would end the client's
// exec as a normal exit).
func TestRelayCutBeatsTheKilledExit(t *testing.T) {
	agentSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			var f protocol.ExecFrame
			if err := wsjson.Read(r.Context(), c, &f); err != nil {
				return
			}
			if f.Type == protocol.FrameKill {
				code := 137
				_ = wsjson.Write(r.Context(), c, protocol.ExecFrame{Type: protocol.FrameExit, ExitCode: &code})
			}
		}
	}))
	defer agentSrv.Close()
	for i := range 20 {
		gone := make(chan struct{})
		relaySrv := relayServer(agentSrv.URL, gone, "access revoked", true)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(relaySrv.URL, "http"), nil)
		if err != nil {
			t.Fatal(err)
		}
		close(gone)
		var f protocol.ExecFrame
		err = wsjson.Read(ctx, c, &f)
		c.CloseNow()
		cancel()
		relaySrv.Close()
		if err != nil || f.Type != protocol.FrameError || f.Error != "access revoked" {
			t.Fatalf("round %d: client got %+v (%v), want the revocation's error frame first", i, f, err)
		}
	}
}

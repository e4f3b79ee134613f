package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

const testToken = "test-token"

// startAgent runs a Server in-process on 127.0.0.1 and returns a client for
// it. Commands are killed when the test ends.
func startAgent(t testing.TB, opts ...Option) (*Client, *Server, string) {
	t.Helper()
	srv, err := NewServer(testToken, opts...)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	addr := strings.TrimPrefix(hs.URL, "http://")
	c := NewClient(addr, testToken)
	t.Cleanup(func() {
		srv.Close()
		c.Close()
		hs.CloseClientConnections()
		hs.Close()
	})
	return c, srv, addr
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func i64(v int64) *int64 { return &v }

// run executes command and returns stdout, stderr and the exit code.
func run(t testing.TB, c *Client, f protocol.ExecFrame) (string, string, int, error) {
	t.Helper()
	var out, errb bytes.Buffer
	if f.TimeoutSeconds == nil {
		f.TimeoutSeconds = i64(20)
	}
	code, err := c.Exec(ctxT(t), f, &out, &errb)
	return out.String(), errb.String(), code, err
}

// wsConn is a raw exec connection for protocol-level tests.
type wsConn struct {
	t *testing.T
	c *websocket.Conn
}

func dial(t *testing.T, c *Client) *wsConn {
	t.Helper()
	conn, err := c.DialExec(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return &wsConn{t, conn}
}

func (w *wsConn) send(f protocol.ExecFrame) {
	w.t.Helper()
	b, _ := json.Marshal(f)
	if err := w.c.Write(ctxT(w.t), websocket.MessageText, b); err != nil {
		w.t.Fatal(err)
	}
}

func (w *wsConn) recv() protocol.ExecFrame {
	w.t.Helper()
	f, err := readFrame(ctxT(w.t), w.c)
	if err != nil {
		w.t.Fatal(err)
	}
	return f
}

// collect reads frames until exit or error, returning stdout, stderr, the
// final frame, and every output frame in order.
func (w *wsConn) collect() (string, string, protocol.ExecFrame, []protocol.ExecFrame) {
	w.t.Helper()
	var out, errb strings.Builder
	var frames []protocol.ExecFrame
	for {
		f := w.recv()
		switch f.Type {
		case protocol.FrameStdout:
			out.WriteString(f.Data)
			frames = append(frames, f)
		case protocol.FrameStderr:
			errb.WriteString(f.Data)
			frames = append(frames, f)
		case protocol.FrameExit, protocol.FrameError:
			return out.String(), errb.String(), f, frames
		}
	}
}

// globAll runs a glob and collects its streamed matches.
func globAll(t testing.TB, c *Client, req GlobRequest) (GlobResult, error) {
	res := GlobResult{}
	var err error
	res.Truncated, err = c.Glob(ctxT(t), req, func(m GlobMatch) error { res.Matches = append(res.Matches, m); return nil })
	return res, err
}

// grepAll runs a grep and collects its streamed matches.
func grepAll(t testing.TB, c *Client, req GrepRequest) (GrepResult, error) {
	res := GrepResult{}
	var err error
	res.Truncated, err = c.Grep(ctxT(t), req, func(m GrepMatch) error { res.Matches = append(res.Matches, m); return nil })
	return res, err
}

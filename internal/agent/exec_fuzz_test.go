package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// FuzzExecFrames plays an agent that answers an exec with arbitrary
// messages (the fuzz input split at newlines), then closes. The daemon's
// Exec must not panic or hang, must write to stdout exactly the data of
// the stdout frames it read before stopping, and must stop at the first
// exit or error frame: an error frame is an *ExecError, an exit frame's
// code is returned.
func FuzzExecFrames(f *testing.F) {
	msgs := make(chan [][]byte, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer conn.CloseNow()
		ctx := r.Context()
		if _, _, err := conn.Read(ctx); err != nil { // the execute frame
			return
		}
		for _, m := range <-msgs {
			if conn.Write(ctx, websocket.MessageText, m) != nil {
				return
			}
		}
		conn.Close(websocket.StatusNormalClosure, "")
	}))
	f.Cleanup(srv.Close)
	c := NewClient(strings.TrimPrefix(srv.URL, "http://"), "token")
	f.Cleanup(c.Close)

	for _, s := range []string{
		`{"type":"started","command_id":"c"}` + "\n" + `{"type":"stdout","data":"hi\n"}` + "\n" + `{"type":"exit","exit_code":3}`,
		`{"type":"stderr","data":"x"}` + "\n" + `{"type":"error","error_type":"CommandTimeout","error":"t"}`,
		`{"type":"exit"}` + "\n" + `{"type":"stdout","data":"after exit"}`,
		`not json`, ``, `{"type":"stdout","data":1}`, `{"type":"exit","exit_code":-1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, input []byte) {
		parts := bytes.Split(input, []byte("\n"))
		msgs <- parts
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		code, err := c.Exec(ctx, protocol.ExecFrame{Command: "true"}, &stdout, &stderr)
		if ctx.Err() != nil {
			t.Fatalf("Exec did not end once the agent closed: %v", err)
		}

		// What a correct reader makes of the same messages.
		var want bytes.Buffer
		wantCode, wantErr, end := -1, "", "" // end: the frame type that ends it
		for _, m := range parts {
			var fr protocol.ExecFrame
			if json.Unmarshal(m, &fr) != nil {
				break
			}
			if fr.Type == protocol.FrameStdout {
				want.WriteString(fr.Data)
			}
			if fr.Type == protocol.FrameExit {
				if fr.ExitCode != nil {
					wantCode = *fr.ExitCode
				}
				end = fr.Type
				break
			}
			if fr.Type == protocol.FrameError {
				wantErr, end = fr.Error, fr.Type
				break
			}
		}
		if stdout.String() != want.String() {
			t.Fatalf("stdout %q, want %q", stdout.String(), want.String())
		}
		var ee *ExecError
		switch {
		case end == protocol.FrameExit && (err != nil || code != wantCode):
			t.Fatalf("exit frame: Exec = %d, %v; want %d", code, err, wantCode)
		case end == protocol.FrameError && (!errors.As(err, &ee) || ee.Message != wantErr):
			t.Fatalf("error frame: Exec = %d, %v; want ExecError %q", code, err, wantErr)
		case end == "" && err == nil:
			t.Fatalf("no exit frame but Exec = %d, nil", code)
		}
	})
}

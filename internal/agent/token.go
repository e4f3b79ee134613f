package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"

	"golang.org/x/sys/unix"
)

// The agent token. Drivers hand it to PID 1 on its standard input (a pipe
// they fill and close before the agent runs), never in its environment or
// argv: root inside the sandbox can read /proc/1/environ and
// /proc/1/cmdline, while the pipe is empty once the agent has read it. The
// daemon gives every boot a fresh token, and replaces the token of a
// sandbox restored from a memory snapshot (whose agent wakes up holding its
// source's) through POST /v1/token before handing the sandbox out.

// Token sizes accepted by POST /v1/token: the daemon's tokens are 64 hex
// digits.
const (
	minRotatedToken = 32
	maxToken        = 4096
)

// ReadToken reads PID 1's token from f (its standard input) up to EOF and
// puts /dev/null in f's place, so nothing started later can find the pipe.
// First it makes the process non-dumpable: the token then lives in its
// memory, and root inside the sandbox, which lacks CAP_SYS_PTRACE, can no
// longer ptrace it or read its /proc/<pid>/mem, maps or environ. Commands
// are dumpable again (execve resets the flag).
func ReadToken(f *os.File) (string, error) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return "", fmt.Errorf("agent: make the process non-dumpable: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxToken+1))
	if err != nil {
		return "", fmt.Errorf("agent: read token from stdin: %w", err)
	}
	token := string(bytes.TrimSpace(b))
	if token == "" || len(b) > maxToken {
		return "", errors.New("agent: no token on stdin (the driver writes it there and closes it)")
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return "", fmt.Errorf("agent: replace stdin: %w", err)
	}
	defer null.Close()
	if err := unix.Dup3(int(null.Fd()), int(f.Fd()), 0); err != nil {
		return "", fmt.Errorf("agent: replace stdin: %w", err)
	}
	return token, nil
}

// RotateTokenRequest is the body of POST /v1/token.
type RotateTokenRequest struct {
	Token string `json:"token"`
}

// validToken reports whether t may become the agent's token: long enough
// to be unguessable and printable ASCII without spaces (it travels in a
// header).
func validToken(t string) bool {
	if len(t) < minRotatedToken || len(t) > maxToken {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] > '~' {
			return false
		}
	}
	return true
}

// handleRotateToken replaces the token. The request itself was
// authenticated with the current token, which stops working as soon as
// this answers; requests already past authentication finish normally.
func (s *Server) handleRotateToken(w http.ResponseWriter, r *http.Request) {
	var req RotateTokenRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 2*maxToken)).Decode(&req); err != nil || !validToken(req.Token) {
		writeError(w, http.StatusBadRequest, "InvalidRequest", "token must be 32 to 4096 printable ASCII characters")
		return
	}
	tok := []byte(req.Token)
	s.token.Store(&tok)
	w.WriteHeader(http.StatusNoContent)
}

// RotateToken makes the agent accept only token from now on, and this
// client use it.
func (c *Client) RotateToken(ctx context.Context, token string) error {
	if err := c.postJSON(ctx, "/v1/token", RotateTokenRequest{Token: token}); err != nil {
		return fmt.Errorf("agent: rotate token: %w", err)
	}
	c.setToken(token)
	return nil
}

// postJSON POSTs v as JSON to path, for the agent's calls that answer 204
// and nothing else, within the client's answer deadline.
func (c *Client) postJSON(ctx context.Context, path string, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.answer)
	defer cancel()
	resp, err := c.do(ctx, http.MethodPost, path, nil, http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer drain(resp)
	return checkStatus(resp, http.StatusNoContent)
}

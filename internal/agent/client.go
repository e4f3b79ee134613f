package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ErrCommandTimeout is matched (errors.Is) by the error Exec returns when the
// agent killed the command at its timeout_seconds.
var ErrCommandTimeout = errors.New("command timed out")

// ErrFileNotFound is matched by errors from file calls on a missing path.
var ErrFileNotFound = errors.New("file not found")

// ExecError is an error frame received from the agent's exec stream.
type ExecError struct {
	Type    string // protocol.Err* (CommandTimeout, CommandNotFound, ...)
	Message string
}

// Error implements error.
func (e *ExecError) Error() string { return fmt.Sprintf("agent exec: %s: %s", e.Type, e.Message) }

// Is makes errors.Is(err, ErrCommandTimeout) work for timeout frames.
func (e *ExecError) Is(target error) bool {
	return target == ErrCommandTimeout && e.Type == protocol.ErrCommandTimeout
}

// HTTPError is a non-success answer from the agent, with its protocol error
// body when it had one.
type HTTPError struct {
	Status  int
	Kind    string // detail.error, e.g. FileNotFound, WriteError
	Message string
}

// Error implements error.
func (e *HTTPError) Error() string {
	return fmt.Sprintf("agent: HTTP %d: %s: %s", e.Status, e.Kind, e.Message)
}

// Is makes errors.Is(err, ErrFileNotFound) work for 404s.
func (e *HTTPError) Is(target error) bool {
	return target == ErrFileNotFound && (e.Status == http.StatusNotFound || e.Kind == errKindFileNotFound)
}

// ProtocolVersion is the version of the daemon↔agent API in this binary.
// The agent reports it in its health answer and the daemon refuses an agent
// reporting another (an agent from before versioning reports none, 0).
// Bump it with any change a daemon and an agent of different builds would
// disagree on: a route, a field, a frame, a bound.
const ProtocolVersion = 1

// healthAnswer is the body of GET /v1/health.
type healthAnswer struct {
	OK       bool `json:"ok"`
	Protocol int  `json:"protocol"`
}

// ErrProtocolVersion is what a *VersionError matches with errors.Is.
var ErrProtocolVersion = errors.New("agent protocol version mismatch")

// VersionError is an agent that speaks another ProtocolVersion: it is from
// another build of cubicle, so the sandbox must be restarted with this
// daemon's agent rather than used half-working.
type VersionError struct{ Agent int }

func (e *VersionError) Error() string {
	return fmt.Sprintf("agent speaks protocol %d, this daemon %d: restart the sandbox to get this build's agent", e.Agent, ProtocolVersion)
}

// Is makes errors.Is(err, ErrProtocolVersion) match.
func (e *VersionError) Is(target error) bool { return target == ErrProtocolVersion }

// Client is the daemon's connection to one sandbox's agent. It keeps
// connections alive, so repeated calls cost one round trip each. Safe for
// concurrent use.
type Client struct {
	base  string                 // http://addr
	ws    string                 // ws://addr
	auth  atomic.Pointer[string] // "Bearer <token>"; RotateToken replaces it
	httpc *http.Client
	// answer bounds every call that waits for a short answer (health,
	// stat, activity, memguard, token) and the exec handshake, whatever
	// the caller's context: an agent that does not answer within it is
	// stuck or gone (its Sentry stopped, say), and the call must fail
	// rather than hang.
	answer time.Duration
}

// answerTimeout is Client.answer: agents answer these calls in
// milliseconds, even under load.
const answerTimeout = 30 * time.Second

// dialTimeout bounds one TCP connect to the agent; inside a host-local
// network namespace a connect either succeeds or is refused within
// microseconds, so a longer wait means the address is not up yet.
const dialTimeout = 500 * time.Millisecond

// dialTries bounds how many times dialAgent tries a connect that times out.
const dialTries = 4

// dialAgent connects to the agent. A connect that times out is tried again
// with twice the wait (0.5, 1, 2, 4 s), within ctx: a Sentry starved of CPU
// on a loaded host can take longer than dialTimeout to answer a SYN (a
// parallel CI run saw an exec fail with "agent unreachable" that way),
// while a refused connect (the agent not listening yet) returns at once
// for WaitReady to poll again.
func dialAgent(ctx context.Context, network, addr string) (net.Conn, error) {
	wait := dialTimeout
	for try := 1; ; try++ {
		d := net.Dialer{Timeout: wait, KeepAlive: 30 * time.Second}
		c, err := d.DialContext(ctx, network, addr)
		var ne net.Error
		if err == nil || try == dialTries || ctx.Err() != nil || !errors.As(err, &ne) || !ne.Timeout() {
			return c, err
		}
		wait *= 2
	}
}

// NewClient returns a client for the agent listening on addr ("ip:port")
// that authenticates with token.
func NewClient(addr, token string) *Client { return newClient(addr, dialAgent, token) }

// ClientFor returns a client for the agent of sandbox id on driver d that
// authenticates with token: through d's own transport where it has one
// (runtime.AgentDialer), else TCP to addr ("ip:port").
func ClientFor(d runtime.Driver, id, addr, token string) *Client {
	ad, ok := d.(runtime.AgentDialer)
	if !ok {
		return NewClient(addr, token)
	}
	return newClient("agent", func(ctx context.Context, _, _ string) (net.Conn, error) { return ad.DialAgent(ctx, id) }, token)
}

func newClient(addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error), token string) *Client {
	tr := &http.Transport{
		Proxy:               nil, // never route sandbox traffic through a host proxy
		DialContext:         dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		// The agent is untrusted: bound what a response's headers may cost.
		MaxResponseHeaderBytes: 64 << 10,
	}
	c := &Client{
		base:   "http://" + addr,
		ws:     "ws://" + addr,
		httpc:  &http.Client{Transport: tr},
		answer: answerTimeout,
	}
	c.setToken(token)
	return c
}

func (c *Client) setToken(token string) {
	a := "Bearer " + token
	c.auth.Store(&a)
}

// Close releases idle connections.
func (c *Client) Close() { c.httpc.CloseIdleConnections() }

// Health checks that the agent answers, accepts the token and speaks this
// daemon's ProtocolVersion; an agent that does not (one that outlived a
// daemon upgrade, in a re-adopted sandbox or a memory snapshot) is a
// *VersionError.
func (c *Client) Health(ctx context.Context) error {
	var h healthAnswer
	if err := c.getJSON(ctx, http.MethodGet, "/v1/health", nil, nil, &h); err != nil {
		return err
	}
	if h.Protocol != ProtocolVersion {
		return &VersionError{Agent: h.Protocol}
	}
	return nil
}

// MemGuard returns the OOM guard's state and kill counter.
func (c *Client) MemGuard(ctx context.Context) (MemGuardStats, error) {
	var st MemGuardStats
	err := c.getJSON(ctx, http.MethodGet, "/v1/memguard", nil, nil, &st)
	return st, err
}

// WaitReady polls Health every interval until it succeeds or ctx ends. It is
// on the sandbox-create hot path: use a small interval (2–5 ms).
func (c *Client) WaitReady(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		actx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		err := c.Health(actx)
		cancel()
		if err == nil {
			return nil
		}
		var he *HTTPError
		if errors.As(err, &he) && he.Status == http.StatusUnauthorized || errors.Is(err, ErrProtocolVersion) {
			return err // retrying cannot fix a wrong token or another agent binary
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent: not ready: %w (last error: %v)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// DialExec opens a raw exec WebSocket, for relaying a client's frames. The
// caller sends the first frame and owns the connection.
func (c *Client) DialExec(ctx context.Context) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.answer) // the handshake only
	defer cancel()
	conn, resp, err := websocket.Dial(ctx, c.ws+"/v1/exec", &websocket.DialOptions{
		HTTPClient: c.httpc,
		HTTPHeader: http.Header{TokenHeader: {*c.auth.Load()}},
	})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return nil, &HTTPError{Status: resp.StatusCode, Kind: "Unauthorized", Message: "invalid agent token"}
		}
		return nil, fmt.Errorf("agent: dial exec: %w", err)
	}
	conn.SetReadLimit(MaxAgentFrame)
	return conn, nil
}

// Exec runs one command to completion, copying its output to stdout and
// stderr (either may be nil), and returns its exit code. req.Type is set
// to execute; with req.Encoding base64 the output is byte for byte, else
// as the protocol's text frames carry it (POST /execute answers text
// anyway, and text frames are smaller). An error frame becomes an
// *ExecError (errors.Is ErrCommandTimeout for timeouts).
func (c *Client) Exec(ctx context.Context, req protocol.ExecFrame, stdout, stderr io.Writer) (int, error) {
	conn, err := c.DialExec(ctx)
	if err != nil {
		return -1, err
	}
	defer conn.CloseNow()
	req.Type = protocol.FrameExecute
	binary := false // until started says so: an older agent answers text
	if err := writeFrame(ctx, conn, req); err != nil {
		return -1, fmt.Errorf("agent: exec: %w", err)
	}
	// A caller giving up must not leave the command running until its idle
	// timeout: send kill on the way out.
	stop := context.AfterFunc(ctx, func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		writeFrame(kctx, conn, protocol.ExecFrame{Type: protocol.FrameKill})
	})
	defer stop()
	for {
		f, err := readFrame(ctx, conn)
		if err != nil {
			return -1, fmt.Errorf("agent: exec: %w", err)
		}
		var w io.Writer
		switch f.Type {
		case protocol.FrameStarted:
			binary = f.Encoding == protocol.EncodingBase64
		case protocol.FrameStdout:
			w = stdout
		case protocol.FrameStderr:
			w = stderr
		case protocol.FrameExit:
			conn.Close(websocket.StatusNormalClosure, "")
			if f.ExitCode == nil {
				return -1, nil
			}
			return *f.ExitCode, nil
		case protocol.FrameError:
			return -1, &ExecError{Type: f.ErrorType, Message: f.Error}
		}
		if w == nil {
			continue
		}
		data, err := protocol.FrameData(f, binary)
		if err != nil {
			return -1, fmt.Errorf("agent: exec: %w", err)
		}
		if _, err := w.Write(data); err != nil {
			return -1, fmt.Errorf("agent: exec: write output: %w", err)
		}
	}
}

// File calls act as user inside the sandbox (its run_config.user; "" is the
// agent's own root): see asUser.

// WriteFile streams r into path (parents created), replacing it atomically.
func (c *Client) WriteFile(ctx context.Context, user, path string, mode os.FileMode, r io.Reader) error {
	q := fileQuery(user, path)
	q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	resp, err := c.do(ctx, http.MethodPut, "/v1/files", q, nil, r)
	if err != nil {
		return err
	}
	defer drain(resp)
	return checkStatus(resp, http.StatusNoContent)
}

// OpenFile GETs path with the caller's headers (Range, If-Range,
// If-None-Match, ...) and returns the response whatever its status, for the
// daemon to relay; the caller closes the body.
func (c *Client) OpenFile(ctx context.Context, user, path string, hdr http.Header) (*http.Response, error) {
	return c.do(ctx, http.MethodGet, "/v1/files", fileQuery(user, path), hdr, nil)
}

// HeadFile is OpenFile with HEAD: headers (size, ETag, Last-Modified) only.
func (c *Client) HeadFile(ctx context.Context, user, path string, hdr http.Header) (*http.Response, error) {
	return c.do(ctx, http.MethodHead, "/v1/files", fileQuery(user, path), hdr, nil)
}

// Stat describes path.
func (c *Client) Stat(ctx context.Context, user, path string) (FileInfo, error) {
	var fi FileInfo
	err := c.getJSON(ctx, http.MethodGet, "/v1/stat", fileQuery(user, path), nil, &fi)
	return fi, err
}

func fileQuery(user, path string) url.Values {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	return q
}

// Glob lists entries under req.Path matching req.Pattern, calling each for
// every match as it is read (see streamSearch).
func (c *Client) Glob(ctx context.Context, req GlobRequest, each func(GlobMatch) error) (truncated bool, err error) {
	return streamSearch(ctx, c, "/v1/glob", req, each)
}

// Grep finds lines containing req.Pattern under req.Path, calling each for
// every match as it is read.
func (c *Client) Grep(ctx context.Context, req GrepRequest, each func(GrepMatch) error) (truncated bool, err error) {
	return streamSearch(ctx, c, "/v1/grep", req, each)
}

// searchSlack is what the daemon reads of a search answer beyond
// MaxSearchBytes (the agent's own cap is approximate).
const searchSlack = 1 << 20

// streamSearch posts a glob or grep and decodes the answer one match at a
// time, so the daemon never holds it whole, reading at most MaxSearchBytes
// plus slack whatever the agent sends. Once matches have been passed to
// each, an answer that is cut off or malformed ends the search as
// truncated rather than failing it; an error before the first match is
// returned. An error from each is returned as is.
func streamSearch[M any](ctx context.Context, c *Client, path string, req any, each func(M) error) (bool, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return false, fmt.Errorf("agent: encode %s: %w", path, err)
	}
	resp, err := c.do(ctx, http.MethodPost, path, nil, nil, bytes.NewReader(b))
	if err != nil {
		return false, err
	}
	defer drain(resp)
	if err := checkStatus(resp, http.StatusOK); err != nil {
		return false, err
	}
	dec := json.NewDecoder(io.LimitReader(resp.Body, MaxSearchBytes+searchSlack))
	n := 0
	bad := func(err error) (bool, error) {
		if n > 0 {
			return true, nil
		}
		return false, fmt.Errorf("agent: decode %s: %w", path, err)
	}
	if err := expectDelim(dec, '{'); err != nil {
		return bad(err)
	}
	truncated := false
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return bad(err)
		}
		switch key {
		case "matches":
			if err := expectDelim(dec, '['); err != nil {
				return bad(err)
			}
			for dec.More() {
				var m M
				if err := dec.Decode(&m); err != nil {
					return bad(err)
				}
				n++
				if err := each(m); err != nil {
					return false, err
				}
			}
			if err := expectDelim(dec, ']'); err != nil {
				return bad(err)
			}
		case "truncated":
			if err := dec.Decode(&truncated); err != nil {
				return bad(err)
			}
		default:
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return bad(err)
			}
		}
	}
	return truncated, nil
}

// expectDelim reads the next token and checks it is d.
func expectDelim(dec *json.Decoder, d json.Delim) error {
	t, err := dec.Token()
	if err != nil {
		return err
	}
	if t != d {
		return fmt.Errorf("want %v, got %v", d, t)
	}
	return nil
}

// maxAnswer bounds the small JSON answers (stat, activity, memguard) the
// daemon reads from an agent.
const maxAnswer = 1 << 20

// getJSON sends body (if any) as JSON and decodes a 200 answer into out.
func (c *Client) getJSON(ctx context.Context, method, path string, q url.Values, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.answer)
	defer cancel()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("agent: encode %s: %w", path, err)
		}
		r = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, q, nil, r)
	if err != nil {
		return err
	}
	defer drain(resp)
	if err := checkStatus(resp, http.StatusOK); err != nil {
		return err
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(out); err != nil {
		return fmt.Errorf("agent: decode %s: %w", path, err)
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path string, q url.Values, hdr http.Header, body io.Reader) (*http.Response, error) {
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", method, path, err)
	}
	for k, vs := range hdr {
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set(TokenHeader, *c.auth.Load())
	resp, err := c.httpc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("agent: %s %s: %w", method, path, err)
	}
	return resp, nil
}

// checkStatus turns an unexpected status into an *HTTPError.
func checkStatus(resp *http.Response, want int) error {
	if resp.StatusCode == want {
		return nil
	}
	e := &HTTPError{Status: resp.StatusCode}
	var body protocol.ErrorBody
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body) == nil {
		e.Kind, e.Message = body.Detail.Error, body.Detail.Message
	}
	return e
}

// drain reads a little of what is left so the connection can be reused,
// then closes the body.
func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

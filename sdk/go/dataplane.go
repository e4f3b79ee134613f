package cubicle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Run executes command in the sandbox through the blocking POST /execute and
// returns its collected output. A non-zero exit code is not an error. Use
// Exec to stream output or feed stdin.
func (c *Client) Run(ctx context.Context, name, command string) (*protocol.ExecuteResult, error) {
	return c.RunRequest(ctx, name, protocol.ExecuteRequest{Command: command})
}

// RunRequest is Run with every field of the request under the caller's
// control (timeout, shell, env, cwd, run_config).
func (c *Client) RunRequest(ctx context.Context, name string, req protocol.ExecuteRequest) (*protocol.ExecuteResult, error) {
	dp, err := c.dataplaneURL(ctx, name)
	if err != nil {
		return nil, err
	}
	// A missing exit_code means -1 (spec D1); Decode keeps preset fields.
	res := protocol.ExecuteResult{ExitCode: -1}
	if err := c.do(ctx, http.MethodPost, dp+"/execute", req, &res); err != nil {
		return nil, fmt.Errorf("run in sandbox %q: %w", name, err)
	}
	return &res, nil
}

// WriteFile writes everything r yields to path in the sandbox (a relative
// path resolves where its commands start: run_config.work_dir, else the
// user's home), replacing the file and creating missing parent
// directories. The body is streamed as multipart/form-data through a pipe,
// so the file is never held in memory whole. If r fails, the upload is
// aborted with r's error.
func (c *Client) WriteFile(ctx context.Context, name, path string, r io.Reader) error {
	dp, err := c.dataplaneURL(ctx, name)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	// errc holds the producer's result; buffered so the goroutine never
	// blocks on it when WriteFile has returned early.
	errc := make(chan error, 1)
	go func() {
		err := writeFilePart(mw, r)
		pw.CloseWithError(err) // nil err closes normally: EOF for the reader
		errc <- err
	}()

	u := dp + "/upload?path=" + url.QueryEscape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, pr)
	if err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("write %s in sandbox %q: %w", path, name, err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := c.send(req)
	if err != nil {
		// Unblock the producer if it is still writing; it may stay blocked in
		// r.Read (e.g. on a terminal) but never on the pipe.
		pr.CloseWithError(err)
		return fmt.Errorf("write %s in sandbox %q: %w", path, name, err)
	}
	defer resp.Body.Close()
	if err := checkResponse(resp); err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("write %s in sandbox %q: %w", path, name, err)
	}
	// A 2xx normally means the server read the whole body and the producer
	// is done. Closing the reader unblocks a producer the server stopped
	// reading from, which then reports the upload as cut short.
	pr.CloseWithError(errUploadCut)
	if err := <-errc; err != nil {
		return fmt.Errorf("write %s in sandbox %q: %w", path, name, err)
	}
	return nil
}

// errUploadCut is what the producer sees if the server answered before
// reading the whole upload.
var errUploadCut = errors.New("server answered before reading the whole upload")

// writeFilePart writes the single "file" part the protocol expects (spec D3).
func writeFilePart(mw *multipart.Writer, r io.Reader) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="file"; filename="file"`)
	h.Set("Content-Type", "application/octet-stream")
	part, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := io.Copy(part, r); err != nil {
		return fmt.Errorf("read source: %w", err)
	}
	return mw.Close()
}

// ReadFile opens path (relative as for WriteFile) in the sandbox for
// reading. The caller must close the returned reader. A missing file gives
// an error for which IsNotFound is true.
func (c *Client) ReadFile(ctx context.Context, name, path string) (io.ReadCloser, error) {
	dp, err := c.dataplaneURL(ctx, name)
	if err != nil {
		return nil, err
	}
	u := dp + "/download?path=" + url.QueryEscape(path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	if err := checkResponse(resp); err != nil {
		resp.Body.Close()
		return nil, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	return resp.Body, nil
}

// ReadFileAt reads at most n bytes of path in the sandbox from byte off
// with an HTTP range request, and returns them with the file's size. An
// off at or past the end gives no bytes. A server that ignores the range
// still gives the right bytes (the skipped prefix is read and dropped);
// the size is then its Content-Length, -1 if it sent none.
func (c *Client) ReadFileAt(ctx context.Context, name, path string, off, n int64) ([]byte, int64, error) {
	if off < 0 || n <= 0 {
		return nil, 0, fmt.Errorf("read %s in sandbox %q: bad range %d+%d", path, name, off, n)
	}
	dp, err := c.dataplaneURL(ctx, name)
	if err != nil {
		return nil, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, dp+"/download?path="+url.QueryEscape(path), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
	resp, err := c.send(req)
	if err != nil {
		return nil, 0, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusRequestedRangeNotSatisfiable:
		size, _ := rangeSize(resp.Header.Get("Content-Range"))
		return nil, size, nil
	case http.StatusPartialContent:
		size, ok := rangeSize(resp.Header.Get("Content-Range"))
		if !ok {
			return nil, 0, fmt.Errorf("read %s in sandbox %q: bad Content-Range %q", path, name, resp.Header.Get("Content-Range"))
		}
		b, err := io.ReadAll(io.LimitReader(resp.Body, n))
		if err != nil {
			return nil, 0, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
		}
		return b, size, nil
	}
	if err := checkResponse(resp); err != nil {
		return nil, 0, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	// A whole-file answer: skip to off, keep n.
	if _, err := io.CopyN(io.Discard, resp.Body, off); err != nil && err != io.EOF {
		return nil, 0, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, n))
	if err != nil {
		return nil, 0, fmt.Errorf("read %s in sandbox %q: %w", path, name, err)
	}
	return b, resp.ContentLength, nil
}

// rangeSize is the complete length in a Content-Range header ("bytes
// 0-9/42" or "bytes */42").
func rangeSize(h string) (int64, bool) {
	_, total, ok := strings.Cut(h, "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(total, 10, 64)
	return n, err == nil && n >= 0
}

// Glob lists the entries under req.Path (absolute; "" is /) whose paths
// match req.Pattern (`*`, `?`, `[...]`, `**` for any depth), as the
// sandbox's run_config user sees them. Truncated marks an answer cut at
// req.Limit or the server's cap.
func (c *Client) Glob(ctx context.Context, name string, req protocol.GlobRequest) (*protocol.GlobResult, error) {
	var out protocol.GlobResult
	if err := c.search(ctx, name, "/glob", req, &out); err != nil {
		return nil, fmt.Errorf("glob %s in sandbox %q: %w", req.Pattern, name, err)
	}
	return &out, nil
}

// Grep finds the lines containing the literal string req.Pattern in the
// files under req.Path (optionally only those matching req.Glob).
func (c *Client) Grep(ctx context.Context, name string, req protocol.GrepRequest) (*protocol.GrepResult, error) {
	var out protocol.GrepResult
	if err := c.search(ctx, name, "/grep", req, &out); err != nil {
		return nil, fmt.Errorf("grep %q in sandbox %q: %w", req.Pattern, name, err)
	}
	return &out, nil
}

// search posts a glob or grep request to the sandbox's dataplane.
func (c *Client) search(ctx context.Context, name, route string, req, out any) error {
	dp, err := c.dataplaneURL(ctx, name)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, dp+route, req, out)
}

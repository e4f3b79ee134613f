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

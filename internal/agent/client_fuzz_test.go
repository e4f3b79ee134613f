package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
)

// fuzzAgent answers every request with one fixed status and body, counting
// the body bytes the client reads.
type fuzzAgent struct {
	status int
	body   []byte
	read   int64
}

func (a *fuzzAgent) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: a.status, Header: http.Header{}, Request: req,
		Body: io.NopCloser(&countReader{r: bytes.NewReader(a.body), n: &a.read})}, nil
}

type countReader struct {
	r io.Reader
	n *int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	*c.n += int64(n)
	return n, err
}

// FuzzClientAnswers feeds arbitrary agent answers (status and body) to the
// daemon's agent client: the agent runs inside the sandbox and is
// untrusted. Search, stat and health must not panic, read no more of an
// answer than their bounds, turn a non-200 answer into an *HTTPError whose
// message is bounded, and report an error rather than invented results
// when an answer is malformed.
func FuzzClientAnswers(f *testing.F) {
	for _, s := range []struct {
		status int
		body   string
	}{
		{200, `{"matches":[{"path":"/a","is_dir":false,"size_bytes":3}],"truncated":false}`},
		{200, `{"matches":[{"path":"/a"},{"path":`},
		{200, `{"truncated":true,"extra":[1,2,{"x":null}],"matches":[]}`},
		{200, `{"path":"/x","size":1,"mode":420,"is_dir":false,"mtime":"2024-01-01T00:00:00Z"}`},
		{200, `[`}, {200, ``}, {200, `{"matches":{}}`},
		{401, `{"detail":{"error":"Unauthorized","message":"bad token"}}`},
		{500, `not json`},
	} {
		f.Add(uint16(s.status), []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, status uint16, body []byte) {
		a := &fuzzAgent{status: 100 + int(status)%500, body: body}
		if a.status < 200 {
			a.status = 200 // a 1xx is no final answer to hand a client
		}
		c := NewClient("agent.invalid:1", "token")
		c.httpc = &http.Client{Transport: a}
		ctx := context.Background()

		n := 0
		_, err := c.Glob(ctx, GlobRequest{Pattern: "*", Path: "/"}, func(GlobMatch) error { n++; return nil })
		checkAnswerErr(t, a, err)
		if a.status != http.StatusOK && (err == nil || n > 0) {
			t.Fatalf("status %d: glob returned %d matches, err %v", a.status, n, err)
		}
		if a.read > MaxSearchBytes+searchSlack {
			t.Fatalf("glob read %d bytes, bound %d", a.read, MaxSearchBytes+searchSlack)
		}
		a.read = 0
		_, err = c.Stat(ctx, "", "/x")
		checkAnswerErr(t, a, err)
		if a.read > maxAnswer {
			t.Fatalf("stat read %d bytes, bound %d", a.read, maxAnswer)
		}
		checkAnswerErr(t, a, c.Health(ctx))
	})
}

// checkAnswerErr: a non-200 answer is an *HTTPError carrying that status
// and at most 64 KiB of the agent's message.
func checkAnswerErr(t *testing.T, a *fuzzAgent, err error) {
	t.Helper()
	if a.status == http.StatusOK {
		return
	}
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != a.status {
		t.Fatalf("status %d answered with error %v", a.status, err)
	}
	if len(he.Message)+len(he.Kind) > 64<<10 {
		t.Fatalf("error message of %d bytes", len(he.Message))
	}
}

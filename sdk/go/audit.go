package cubicle

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// AuditOptions filter and page a sandbox's audit record.
type AuditOptions struct {
	// SinceSeq returns events after this seq (0: from the start).
	SinceSeq int64
	// Kinds keeps only these kinds (protocol.Kind*); empty keeps all.
	Kinds []string
	// Step keeps only that command's events (0: all).
	Step int64
	// Limit bounds a page (server default 100, max 1000); ignored by
	// FollowAudit.
	Limit int
}

func (o AuditOptions) query() url.Values {
	q := url.Values{}
	if o.SinceSeq > 0 {
		q.Set("since_seq", strconv.FormatInt(o.SinceSeq, 10))
	}
	if len(o.Kinds) > 0 {
		q.Set("kinds", strings.Join(o.Kinds, ","))
	}
	if o.Step > 0 {
		q.Set("step", strconv.FormatInt(o.Step, 10))
	}
	if o.Limit > 0 {
		q.Set("limit", strconv.Itoa(o.Limit))
	}
	return q
}

// Audit returns a page of sandbox name's audit record: its lifecycle
// events and commands, oldest first. Page on with SinceSeq = NextSeq.
func (c *Client) Audit(ctx context.Context, name string, o AuditOptions) (*protocol.AuditList, error) {
	return c.auditPage(ctx, "/boxes/"+escape(name)+"/audit", o)
}

// AuditByID is Audit for a sandbox named by id, which works after the
// sandbox is deleted (for its workspace's admins).
func (c *Client) AuditByID(ctx context.Context, id string, o AuditOptions) (*protocol.AuditList, error) {
	return c.auditPage(ctx, "/audit/sandboxes/"+escape(id), o)
}

func (c *Client) auditPage(ctx context.Context, path string, o AuditOptions) (*protocol.AuditList, error) {
	var l protocol.AuditList
	if q := o.query(); len(q) > 0 {
		path += "?" + q.Encode()
	}
	if err := c.do(ctx, http.MethodGet, path, nil, &l); err != nil {
		return nil, fmt.Errorf("read audit record: %w", err)
	}
	return &l, nil
}

// AuditStep returns one command of sandbox name's record with its events
// and captured output.
func (c *Client) AuditStep(ctx context.Context, name string, step int64) (*protocol.AuditStep, error) {
	var s protocol.AuditStep
	if err := c.do(ctx, http.MethodGet, "/boxes/"+escape(name)+"/audit/steps/"+strconv.FormatInt(step, 10), nil, &s); err != nil {
		return nil, fmt.Errorf("read audit step %d of %s: %w", step, name, err)
	}
	return &s, nil
}

// FollowAudit streams sandbox name's record from o.SinceSeq on, calling
// each for every event as it is recorded, until ctx ends, each returns an
// error (returned as is), or the server ends the stream (nil).
func (c *Client) FollowAudit(ctx context.Context, name string, o AuditOptions, each func(protocol.AuditEvent) error) error {
	o.Limit = 0
	q := o.query()
	q.Set("follow", "true")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/boxes/"+escape(name)+"/audit?"+q.Encode(), nil)
	if err != nil {
		return fmt.Errorf("follow audit record of %s: %w", name, err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.send(req)
	if err != nil {
		return fmt.Errorf("follow audit record of %s: %w", name, err)
	}
	defer resp.Body.Close()
	if err := checkResponse(resp); err != nil {
		return fmt.Errorf("follow audit record of %s: %w", name, err)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // id:, event:, keep-alive comments, blank separators
		}
		var e protocol.AuditEvent
		if err := json.Unmarshal([]byte(data), &e); err != nil {
			return fmt.Errorf("follow audit record of %s: decode event: %w", name, err)
		}
		if err := each(e); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("follow audit record of %s: %w", name, err)
	}
	return nil
}

// AuditDiff compares the histories of sandboxes a and b (names or ids):
// the steps they share, then each one's own.
func (c *Client) AuditDiff(ctx context.Context, a, b string) (*protocol.AuditDiff, error) {
	var out protocol.AuditDiff
	q := url.Values{"a": {a}, "b": {b}}
	if err := c.do(ctx, http.MethodGet, "/audit/diff?"+q.Encode(), nil, &out); err != nil {
		return nil, fmt.Errorf("audit diff %s %s: %w", a, b, err)
	}
	return &out, nil
}

// Replay re-runs sandbox name's recorded commands in a new sandbox and
// reports, per step, whether exit and output matched.
func (c *Client) Replay(ctx context.Context, name string, req protocol.ReplayRequest) (*protocol.ReplayResult, error) {
	var out protocol.ReplayResult
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/replay", req, &out); err != nil {
		return nil, fmt.Errorf("replay %s: %w", name, err)
	}
	if out.Sandbox != nil {
		c.rememberDataplane(out.Sandbox)
	}
	return &out, nil
}

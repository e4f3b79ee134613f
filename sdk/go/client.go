// Package cubicle is the Go client of a Cubicle daemon. It speaks the
// LangSmith sandbox protocol (shared/spec/langsmith-sandbox-protocol.md)
// through the wire types of package protocol, so the same program works
// against any server that implements that protocol.
//
// The API has two planes. Control-plane calls (snapshots and sandboxes) go to
// <endpoint>/v2/sandboxes. Runtime calls (Exec, Run, WriteFile, ReadFile) go
// to the sandbox's own dataplane_url, which the Client looks up once per
// sandbox name and caches.
//
// Every method takes a context first; cancelling it aborts the call. Errors
// returned by the server are *APIError values; use IsNotFound, IsConflict
// and errors.Is(err, ErrCommandTimeout) rather than matching messages.
package cubicle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// basePath is where the control plane lives under the endpoint.
const basePath = "/v2/sandboxes"

// Client talks to one Cubicle endpoint with one API key. It is safe for
// concurrent use. The zero value is not usable; call New.
type Client struct {
	base   string // <endpoint>/v2/sandboxes, no trailing slash
	apiKey string
	http   *http.Client

	pollInterval time.Duration
	// reconnectDelay returns how long to wait before the n-th (1-based)
	// consecutive exec reconnect attempt.
	reconnectDelay func(n int) time.Duration

	// header is added to every request, WebSocket handshakes included
	// (WithHeader).
	header http.Header

	mu        sync.Mutex
	dataplane map[string]string // sandbox name → dataplane_url
}

// Option configures a Client built by New.
type Option func(*Client)

// WithHTTPClient makes the Client send every request, WebSocket handshakes
// included, through hc. Use it for custom transports, proxies or TLS roots.
// hc's Timeout, if set, bounds every HTTP call including file transfers (but
// only the handshake of an Exec stream), so prefer contexts for deadlines.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.http = hc
		}
	}
}

// WithHeader adds a header to every request the Client sends, WebSocket
// handshakes included: a front door names itself with it (X-Cubicle-Door).
// The API key and User-Agent are the Client's own and cannot be replaced.
func WithHeader(name, value string) Option {
	return func(c *Client) { c.header.Add(name, value) }
}

// WithPollInterval sets how often WaitSnapshot and WaitSandbox poll
// (default 1 s). The first poll is always immediate.
func WithPollInterval(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.pollInterval = d
		}
	}
}

// WithDoor makes every request (WebSocket handshakes included) name door
// (protocol.DoorMCP, protocol.DoorE2B) in protocol.DoorHeader, so the
// daemon records which front door a command or file transfer came
// through. For programs that translate another protocol into this API; it
// grants nothing.
func WithDoor(door string) Option {
	return WithHeader(protocol.DoorHeader, door)
}

// New returns a Client for endpoint (e.g. "http://127.0.0.1:8080") that
// authenticates with apiKey. An endpoint that already ends in /v2/sandboxes
// or /api/v2/sandboxes is used as is.
func New(endpoint, apiKey string, opts ...Option) *Client {
	base := strings.TrimRight(endpoint, "/")
	if !strings.HasSuffix(base, basePath) {
		base += basePath
	}
	c := &Client{
		base:           base,
		apiKey:         apiKey,
		http:           http.DefaultClient,
		pollInterval:   time.Second,
		reconnectDelay: defaultReconnectDelay,
		dataplane:      map[string]string{},
		header:         http.Header{},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// defaultReconnectDelay follows the official client: 0.5, 1, 2, 4, 8 s.
func defaultReconnectDelay(n int) time.Duration {
	d := 500 * time.Millisecond << (n - 1)
	return min(d, 8*time.Second)
}

// do sends one JSON request to the control plane (path relative to base) or
// to an absolute URL, and decodes a JSON response into out when out is
// non-nil. Any non-2xx status becomes an *APIError.
func (c *Client) do(ctx context.Context, method, target string, in, out any) error {
	u := target
	if !strings.HasPrefix(target, "http://") && !strings.HasPrefix(target, "https://") {
		u = c.base + target
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", method, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return fmt.Errorf("build %s %s: %w", method, u, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkResponse(resp); err != nil {
		return err
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s response: %w", method, req.URL.Path, err)
	}
	return nil
}

// send adds the headers every request carries and performs it.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	c.setHeaders(req.Header)
	// Do's *url.Error already names the method and URL.
	return c.http.Do(req)
}

// setHeaders sets on h the headers every request carries: WithHeader's
// (the door among them), the key and the user agent.
func (c *Client) setHeaders(h http.Header) {
	for k, v := range c.header {
		h[k] = append([]string(nil), v...)
	}
	h.Set("X-Api-Key", c.apiKey)
	h.Set("User-Agent", "cubicle-go")
}

// escape encodes one path segment the way the official client does
// (encodeURIComponent).
func escape(s string) string { return url.PathEscape(s) }

// ListOptions filters and pages list calls. Zero fields are not sent, so the
// server's defaults apply (limit 50, offset 0, oldest first). Labels,
// SortBy, SortOrder, CreatedBy and Status apply to sandbox and snapshot
// lists only.
type ListOptions struct {
	NameContains string
	Limit        int
	Offset       int
	// Cursor is a NextCursor of the same list (and sort) to continue
	// from, instead of Offset.
	Cursor string
	// Labels are "key" (has the label) or "key=value"; all must match.
	Labels []string
	// SortBy is a column (created_at, updated_at, name, status, ...);
	// SortOrder is "asc" or "desc".
	SortBy, SortOrder string
	// CreatedBy is "me" or a user id.
	CreatedBy string
	Status    string
}

func (o ListOptions) query() string {
	q := url.Values{}
	for k, v := range map[string]string{"name_contains": o.NameContains, "cursor": o.Cursor, "sort_by": o.SortBy,
		"sort_order": o.SortOrder, "created_by": o.CreatedBy, "status": o.Status} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for _, l := range o.Labels {
		q.Add("label", l)
	}
	if o.Limit > 0 {
		// With a cursor, the page size is page_size, which asks for
		// keyset next_cursors.
		k := "limit"
		if o.Cursor != "" {
			k = "page_size"
		}
		q.Set(k, fmt.Sprint(o.Limit))
	}
	if o.Offset > 0 {
		q.Set("offset", fmt.Sprint(o.Offset))
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// rememberDataplane caches sb's dataplane URL under its name.
func (c *Client) rememberDataplane(sb *protocol.Sandbox) {
	if sb == nil || sb.Name == "" || sb.DataplaneURL == "" {
		return
	}
	c.mu.Lock()
	c.dataplane[sb.Name] = strings.TrimRight(sb.DataplaneURL, "/")
	c.mu.Unlock()
}

// forgetDataplane drops the cached dataplane URL of name, so the next runtime
// call asks the control plane again (after a delete, or a rename).
func (c *Client) forgetDataplane(name string) {
	c.mu.Lock()
	delete(c.dataplane, name)
	c.mu.Unlock()
}

// dataplaneURL returns the dataplane base URL of the sandbox called name,
// from the cache or from GetSandbox.
func (c *Client) dataplaneURL(ctx context.Context, name string) (string, error) {
	c.mu.Lock()
	u, ok := c.dataplane[name]
	c.mu.Unlock()
	if ok {
		return u, nil
	}
	sb, err := c.GetSandbox(ctx, name)
	if err != nil {
		return "", err
	}
	if sb.DataplaneURL == "" {
		return "", fmt.Errorf("sandbox %q: %w", name, ErrNoDataplane)
	}
	return strings.TrimRight(sb.DataplaneURL, "/"), nil
}

package cubicle

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// CaptureSnapshot snapshots sandbox name's filesystem as it is now (spec
// X1). The sandbox keeps running; it is frozen only for the copy. Cubicle
// returns the snapshot ready; a server that answers "building" can be
// waited for with WaitSnapshot.
func (c *Client) CaptureSnapshot(ctx context.Context, name string, req protocol.CaptureSnapshotRequest) (*protocol.Snapshot, error) {
	var s protocol.Snapshot
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/snapshot", req, &s); err != nil {
		return nil, fmt.Errorf("capture snapshot of %s: %w", name, err)
	}
	return &s, nil
}

// Fork captures sandbox name and boots req.Count branches from the capture
// (a Cubicle extension). It returns once every branch is ready.
func (c *Client) Fork(ctx context.Context, name string, req protocol.ForkRequest) (*protocol.ForkResponse, error) {
	var r protocol.ForkResponse
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/fork", req, &r); err != nil {
		return nil, fmt.Errorf("fork %s: %w", name, err)
	}
	return &r, nil
}

// ResetSandbox discards everything sandbox name wrote and restarts it from
// snapshotID ("" for its own snapshot).
func (c *Client) ResetSandbox(ctx context.Context, name, snapshotID string) (*protocol.Sandbox, error) {
	var s protocol.Sandbox
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/reset", protocol.ResetRequest{SnapshotID: snapshotID}, &s); err != nil {
		return nil, fmt.Errorf("reset %s: %w", name, err)
	}
	return &s, nil
}

// Diff lists what changed going from a to b, each a sandbox name or a
// snapshot id or name.
func (c *Client) Diff(ctx context.Context, a, b string) (*protocol.DiffResponse, error) {
	var d protocol.DiffResponse
	q := url.Values{"a": {a}, "b": {b}}
	if err := c.do(ctx, http.MethodGet, "/diff?"+q.Encode(), nil, &d); err != nil {
		return nil, fmt.Errorf("diff %s %s: %w", a, b, err)
	}
	return &d, nil
}

// Info is the daemon's /healthz report: its runtime, storage backend,
// health checks and store space.
type Info = protocol.Health

// Info returns the daemon's /healthz report. An unavailable daemon answers
// 503 with the same report, returned here without an error (Status says
// "unavailable" and Reasons why).
func (c *Client) Info(ctx context.Context) (*Info, error) {
	root := strings.TrimSuffix(c.base, "/v2/sandboxes")
	root = strings.TrimSuffix(strings.TrimSuffix(root, "/api/v1"), "/api")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, root+"/healthz", nil)
	if err != nil {
		return nil, fmt.Errorf("daemon info: %w", err)
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, fmt.Errorf("daemon info: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		if err := checkResponse(resp); err != nil {
			return nil, fmt.Errorf("daemon info: %w", err)
		}
	}
	var in Info
	if err := json.NewDecoder(resp.Body).Decode(&in); err != nil {
		return nil, fmt.Errorf("daemon info: decode: %w", err)
	}
	return &in, nil
}

// Leftovers lists host state of sandboxes the daemon has no record of
// (instance admin only).
func (c *Client) Leftovers(ctx context.Context) ([]protocol.Leftover, error) {
	var l protocol.Leftovers
	if err := c.do(ctx, http.MethodGet, "/admin/leftovers", nil, &l); err != nil {
		return nil, fmt.Errorf("list leftovers: %w", err)
	}
	return l.Leftovers, nil
}

// CleanLeftovers cleans what Leftovers lists (data is moved aside, not
// deleted) and returns what was cleaned (instance admin only).
func (c *Client) CleanLeftovers(ctx context.Context) ([]protocol.Leftover, error) {
	var l protocol.Leftovers
	if err := c.do(ctx, http.MethodPost, "/admin/leftovers/clean", nil, &l); err != nil {
		return nil, fmt.Errorf("clean leftovers: %w", err)
	}
	return l.Leftovers, nil
}

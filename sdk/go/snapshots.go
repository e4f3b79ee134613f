package cubicle

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// CreateSnapshot starts building a snapshot from req.DockerImage and returns
// it at once, normally in status "building". Use WaitSnapshot to block until
// the build ends.
func (c *Client) CreateSnapshot(ctx context.Context, req protocol.CreateSnapshotRequest) (*protocol.Snapshot, error) {
	var s protocol.Snapshot
	if err := c.do(ctx, http.MethodPost, "/snapshots", req, &s); err != nil {
		return nil, fmt.Errorf("create snapshot %q: %w", req.Name, err)
	}
	return &s, nil
}

// GetSnapshot returns the snapshot with the given id (or name[:tag] where
// the server supports it).
func (c *Client) GetSnapshot(ctx context.Context, id string) (*protocol.Snapshot, error) {
	var s protocol.Snapshot
	if err := c.do(ctx, http.MethodGet, "/snapshots/"+escape(id), nil, &s); err != nil {
		return nil, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return &s, nil
}

// ListSnapshots returns one page of snapshots. Snapshots is always filled,
// from items when the server sends only that field.
func (c *Client) ListSnapshots(ctx context.Context, opts ListOptions) (*protocol.SnapshotList, error) {
	var l protocol.SnapshotList
	if err := c.do(ctx, http.MethodGet, "/snapshots"+opts.query(), nil, &l); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	if l.Snapshots == nil {
		l.Snapshots = l.Items
	}
	return &l, nil
}

// DeleteSnapshot deletes the snapshot with the given id.
func (c *Client) DeleteSnapshot(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/snapshots/"+escape(id), nil, nil); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return nil
}

// WaitSnapshot polls the snapshot until it is ready or failed, calling
// onProgress (if non-nil) with every polled state, which carries
// PullBytesDone/PullBytesTotal while an image is being pulled. The first poll
// is immediate.
//
// A failed build returns the last snapshot and an error wrapping
// ErrSnapshotFailed with the server's status_message. The deadline is ctx's:
// on expiry the build keeps running on the server.
func (c *Client) WaitSnapshot(ctx context.Context, id string, onProgress func(protocol.Snapshot)) (*protocol.Snapshot, error) {
	t := time.NewTicker(c.pollInterval)
	defer t.Stop()
	for {
		s, err := c.GetSnapshot(ctx, id)
		if err != nil {
			return nil, err
		}
		if onProgress != nil {
			onProgress(*s)
		}
		switch s.Status {
		case protocol.SnapshotReady:
			return s, nil
		case protocol.SnapshotFailed:
			msg := s.StatusMessage
			if msg == "" {
				msg = "no status message"
			}
			return s, fmt.Errorf("%w: snapshot %s (%s): %s", ErrSnapshotFailed, s.Name, s.ID, msg)
		}
		select {
		case <-ctx.Done():
			return s, fmt.Errorf("wait for snapshot %s (last status %q): %w", id, s.Status, ctx.Err())
		case <-t.C:
		}
	}
}

// SetSnapshotPool keeps size pre-booted instances of snapshot id (or
// name) for creates to claim, each recycled after maxAgeSeconds (0:
// never); size 0 removes the pool. It takes a workspace admin.
func (c *Client) SetSnapshotPool(ctx context.Context, id string, size, maxAgeSeconds int64) (*protocol.SnapshotPool, error) {
	var out protocol.SnapshotPool
	req := protocol.SetSnapshotPoolRequest{Size: size, MaxAgeSeconds: maxAgeSeconds}
	if err := c.do(ctx, http.MethodPut, "/snapshots/"+escape(id)+"/pool", req, &out); err != nil {
		return nil, fmt.Errorf("set pool of snapshot %q: %w", id, err)
	}
	return &out, nil
}

// SnapshotPool returns snapshot id's warm pool (size 0: none).
func (c *Client) SnapshotPool(ctx context.Context, id string) (*protocol.SnapshotPool, error) {
	var out protocol.SnapshotPool
	if err := c.do(ctx, http.MethodGet, "/snapshots/"+escape(id)+"/pool", nil, &out); err != nil {
		return nil, fmt.Errorf("get pool of snapshot %q: %w", id, err)
	}
	return &out, nil
}

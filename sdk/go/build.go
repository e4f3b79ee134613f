package cubicle

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// BuildSnapshot starts a Dockerfile build on the daemon (a Cubicle
// extension) and returns the snapshot, in status building. contextTar is
// the build context as a tar stream (nil: an empty context); its
// .dockerignore applies, and req.Dockerfile, when empty, is the context's
// own Dockerfile. Follow the steps with FollowBuildLog, and the outcome
// with WaitSnapshot: a failed step leaves the snapshot failed, with the
// step's output and exit code in its status_message.
func (c *Client) BuildSnapshot(ctx context.Context, req protocol.BuildSnapshotRequest, contextTar io.Reader) (*protocol.Snapshot, error) {
	q := url.Values{"name": {req.Name}}
	for k, v := range map[string]string{"tag": req.Tag, "dockerfile": req.Dockerfile, "target": req.Target,
		"start_cmd": req.StartCmd, "ready_cmd": req.ReadyCmd} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if req.NoCache {
		q.Set("no_cache", "true")
	}
	if req.FSCapacityBytes > 0 {
		q.Set("fs_capacity_bytes", strconv.FormatInt(req.FSCapacityBytes, 10))
	}
	keys := make([]string, 0, len(req.BuildArgs))
	for k := range req.BuildArgs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("build_arg", k+"="+req.BuildArgs[k])
	}
	if contextTar == nil {
		contextTar = http.NoBody
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/snapshots?"+q.Encode(), contextTar)
	if err != nil {
		return nil, fmt.Errorf("build snapshot request: %w", err)
	}
	hr.Header.Set("Content-Type", "application/x-tar")
	hr.Header.Set("Accept", "application/json")
	resp, err := c.send(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := checkResponse(resp); err != nil {
		return nil, fmt.Errorf("build snapshot %q: %w", req.Name, err)
	}
	var s protocol.Snapshot
	if err := decodeJSON(resp.Body, &s); err != nil {
		return nil, fmt.Errorf("decode build snapshot response: %w", err)
	}
	return &s, nil
}

// FollowBuildLog copies the step log of snapshot id's Dockerfile build to
// w as it is written, returning when the build has ended (or ctx ends).
func (c *Client) FollowBuildLog(ctx context.Context, id string, w io.Writer) error {
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/snapshots/"+escape(id)+"/build-log", nil)
	if err != nil {
		return fmt.Errorf("build log request: %w", err)
	}
	resp, err := c.send(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := checkResponse(resp); err != nil {
		return fmt.Errorf("build log of snapshot %s: %w", id, err)
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("build log of snapshot %s: %w", id, err)
	}
	return nil
}

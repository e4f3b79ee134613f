package cubicle

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// Image is an image in the daemon's local store (a Cubicle extension).
type Image struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

type imageList struct {
	Images     []Image `json:"images"`
	UsageBytes int64   `json:"usage_bytes"`
}

// ImageRemoval says what removing an image freed: image records no name
// pointed at any more, and layers no image and no snapshot used.
type ImageRemoval struct {
	Removed     string `json:"removed"`
	FreedImages int    `json:"freed_images"`
	FreedLayers int    `json:"freed_layers"`
	FreedBytes  int64  `json:"freed_bytes"`
}

// LoadImage streams a `docker save` tarball or OCI archive into the daemon's
// local image store, which snapshots consult before any registry. name
// (optional) names a single-image archive. Needs an admin key.
func (c *Client) LoadImage(ctx context.Context, archive io.Reader, name string) ([]Image, error) {
	u := c.base + "/images/load"
	if name != "" {
		u += "?name=" + url.QueryEscape(name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, archive)
	if err != nil {
		return nil, fmt.Errorf("build image load request: %w", err)
	}
	req.Header.Set("Content-Type", "application/x-tar")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := checkResponse(resp); err != nil {
		return nil, err
	}
	var out imageList
	if err := decodeJSON(resp.Body, &out); err != nil {
		return nil, fmt.Errorf("decode image load response: %w", err)
	}
	return out.Images, nil
}

// ListImages lists the images of the caller's workspace.
func (c *Client) ListImages(ctx context.Context) ([]Image, error) {
	var out imageList
	if err := c.do(ctx, http.MethodGet, "/images", nil, &out); err != nil {
		return nil, err
	}
	return out.Images, nil
}

// ImageUsage is the unpacked size of the images the caller's workspace
// holds, each layer counted once.
func (c *Client) ImageUsage(ctx context.Context) (int64, error) {
	var out imageList
	if err := c.do(ctx, http.MethodGet, "/images", nil, &out); err != nil {
		return 0, err
	}
	return out.UsageBytes, nil
}

// RemoveImage removes one of the workspace's image names (a bare digest
// removes every name of that image) and frees what nothing uses any more.
// Needs an admin key.
func (c *Client) RemoveImage(ctx context.Context, ref string) (*ImageRemoval, error) {
	segs := strings.Split(ref, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	var out ImageRemoval
	if err := c.do(ctx, http.MethodDelete, "/images/"+strings.Join(segs, "/"), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

func decodeJSON(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }

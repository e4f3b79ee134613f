package cubicle

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// ServiceURL exposes a port of sandbox name through the daemon's gateway
// (spec §9): a token URL, or with req.Access a login URL. Requests to the
// returned ServiceURL carry protocol.ServiceTokenHeader with Token.
func (c *Client) ServiceURL(ctx context.Context, name string, req protocol.ServiceURLRequest) (*protocol.ServiceURLResponse, error) {
	var out protocol.ServiceURLResponse
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/service-url", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DownloadURL mints a link to a file of sandbox name that needs no other
// credential (spec X2).
func (c *Client) DownloadURL(ctx context.Context, name string, req protocol.DownloadURLRequest) (*protocol.DownloadURLResponse, error) {
	var out protocol.DownloadURLResponse
	if err := c.do(ctx, http.MethodPost, "/boxes/"+escape(name)+"/download-url", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

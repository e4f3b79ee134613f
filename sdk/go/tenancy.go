package cubicle

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Tenancy calls (a Cubicle extension): workspaces, users, API keys and the
// access audit. Workspace management needs the instance admin key; users
// and keys of a workspace need one of its admin keys (a member may list
// users and manage its own member keys). Calls that take a workspace
// argument act in the caller's workspace when it is "" (another one only
// for the instance admin).

// CreateWorkspace creates a workspace (instance admin).
func (c *Client) CreateWorkspace(ctx context.Context, name string) (*protocol.Workspace, error) {
	var out protocol.Workspace
	if err := c.do(ctx, http.MethodPost, "/workspaces", protocol.CreateWorkspaceRequest{Name: name}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListWorkspaces lists every workspace for the instance admin, the
// caller's own for anyone else.
func (c *Client) ListWorkspaces(ctx context.Context) ([]protocol.Workspace, error) {
	var out protocol.WorkspaceList
	if err := c.do(ctx, http.MethodGet, "/workspaces", nil, &out); err != nil {
		return nil, err
	}
	return out.Workspaces, nil
}

// GetWorkspace returns a workspace by id or name.
func (c *Client) GetWorkspace(ctx context.Context, ref string) (*protocol.Workspace, error) {
	var out protocol.Workspace
	if err := c.do(ctx, http.MethodGet, "/workspaces/"+escape(ref), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteWorkspace deletes an empty workspace with its users and keys
// (instance admin; a conflict while it has sandboxes or snapshots).
func (c *Client) DeleteWorkspace(ctx context.Context, ref string) error {
	return c.do(ctx, http.MethodDelete, "/workspaces/"+escape(ref), nil, nil)
}

// inWorkspace is the workspace_id query of a call acting in workspace.
func inWorkspace(workspace string) string {
	if workspace == "" {
		return ""
	}
	return "?workspace_id=" + url.QueryEscape(workspace)
}

// CreateUser adds a user (req.WorkspaceID selects the workspace).
func (c *Client) CreateUser(ctx context.Context, req protocol.CreateUserRequest) (*protocol.User, error) {
	var out protocol.User
	if err := c.do(ctx, http.MethodPost, "/users", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListUsers lists a workspace's users.
func (c *Client) ListUsers(ctx context.Context, workspace string) ([]protocol.User, error) {
	var out protocol.UserList
	if err := c.do(ctx, http.MethodGet, "/users"+inWorkspace(workspace), nil, &out); err != nil {
		return nil, err
	}
	return out.Users, nil
}

// GetUser returns a user of a workspace.
func (c *Client) GetUser(ctx context.Context, workspace, id string) (*protocol.User, error) {
	var out protocol.User
	if err := c.do(ctx, http.MethodGet, "/users/"+escape(id)+inWorkspace(workspace), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteUser deletes a user and revokes its keys.
func (c *Client) DeleteUser(ctx context.Context, workspace, id string) error {
	return c.do(ctx, http.MethodDelete, "/users/"+escape(id)+inWorkspace(workspace), nil, nil)
}

// CreateKey makes an API key; the answer's Key is the secret, returned
// only here.
func (c *Client) CreateKey(ctx context.Context, req protocol.CreateKeyRequest) (*protocol.Key, error) {
	var out protocol.Key
	if err := c.do(ctx, http.MethodPost, "/keys", req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListKeys lists a workspace's keys (a member's: its own), without
// secrets.
func (c *Client) ListKeys(ctx context.Context, workspace string) ([]protocol.Key, error) {
	var out protocol.KeyList
	if err := c.do(ctx, http.MethodGet, "/keys"+inWorkspace(workspace), nil, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// RevokeKey revokes a key; it stops working at once.
func (c *Client) RevokeKey(ctx context.Context, workspace, id string) error {
	return c.do(ctx, http.MethodDelete, "/keys/"+escape(id)+inWorkspace(workspace), nil, nil)
}

// WhoAmI says whom the client's key acts as.
func (c *Client) WhoAmI(ctx context.Context) (*protocol.WhoAmI, error) {
	var out protocol.WhoAmI
	if err := c.do(ctx, http.MethodGet, "/whoami", nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AccessQuery selects access audit records; zero fields are not sent.
// WorkspaceID "*" reads every workspace (instance admin).
type AccessQuery struct {
	Sandbox     string
	User        string
	Since       time.Time
	Cursor      string
	Limit       int
	WorkspaceID string
}

func (q AccessQuery) query() string {
	v := url.Values{}
	for k, s := range map[string]string{"sandbox": q.Sandbox, "user": q.User, "cursor": q.Cursor, "workspace_id": q.WorkspaceID} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}

// AccessLog reads one page of the access audit (workspace admins), oldest
// first; pass the answer's NextCursor as Cursor for the next page.
func (c *Client) AccessLog(ctx context.Context, q AccessQuery) (*protocol.AccessList, error) {
	var out protocol.AccessList
	if err := c.do(ctx, http.MethodGet, "/audit/access"+q.query(), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// IsUnauthorized reports whether err is a 401: no key, or one that is
// unknown, revoked or expired.
func IsUnauthorized(err error) bool { return hasStatus(err, http.StatusUnauthorized) }

// IsForbidden reports whether err is a 403: the key's role may not do it.
func IsForbidden(err error) bool { return hasStatus(err, http.StatusForbidden) }

func hasStatus(err error, status int) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.Status == status
}

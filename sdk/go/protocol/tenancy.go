package protocol

import "time"

// Tenancy (a Cubicle extension): workspaces, their users, API keys, and
// the access audit. Under every control-plane prefix:
//
//	POST   /workspaces {name}                         → Workspace (instance admin)
//	GET    /workspaces                                → WorkspaceList
//	GET    /workspaces/{id}                           → Workspace
//	DELETE /workspaces/{id}                           (409 while it has sandboxes or snapshots)
//	POST   /users CreateUserRequest                   → User
//	GET    /users[?workspace_id=]                     → UserList
//	GET    /users/{id}[?workspace_id=]                → User
//	DELETE /users/{id}[?workspace_id=]                (revokes the user's keys)
//	POST   /keys CreateKeyRequest                     → Key with its secret (the only time it is shown)
//	GET    /keys[?workspace_id=]                      → KeyList
//	DELETE /keys/{id}[?workspace_id=]                 (revocation takes effect at once)
//	GET    /whoami                                    → WhoAmI
//	GET    /audit/access?sandbox=&user=&since=&cursor=&limit=&workspace_id= → AccessList

// Key roles.
const (
	RoleAdmin  = "admin"
	RoleMember = "member"
)

// CreateWorkspaceRequest is the body of POST /workspaces.
type CreateWorkspaceRequest struct {
	Name string `json:"name"`
}

// Workspace is a tenant.
type Workspace struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// WorkspaceList is the answer to GET /workspaces.
type WorkspaceList struct {
	Workspaces []Workspace `json:"workspaces"`
}

// CreateUserRequest is the body of POST /users. WorkspaceID (instance
// admin only) defaults to the caller's workspace.
type CreateUserRequest struct {
	Name        string `json:"name"`
	Email       string `json:"email,omitempty"`
	WorkspaceID string `json:"workspace_id,omitempty"`
}

// User is a user of a workspace; records name their creator by its ID.
type User struct {
	ID          string    `json:"id"`
	WorkspaceID string    `json:"workspace_id"`
	Name        string    `json:"name"`
	Email       string    `json:"email,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
}

// UserList is the answer to GET /users.
type UserList struct {
	Users []User `json:"users"`
}

// CreateKeyRequest is the body of POST /keys. UserID defaults to the
// caller's own user, WorkspaceID (instance admin only) to the caller's
// workspace; no ExpiresInSeconds: the key does not expire.
type CreateKeyRequest struct {
	Name             string `json:"name,omitempty"`
	UserID           string `json:"user_id,omitempty"`
	Role             string `json:"role"`
	WorkspaceID      string `json:"workspace_id,omitempty"`
	ExpiresInSeconds *int64 `json:"expires_in_seconds,omitempty"`
}

// Key describes an API key. Key (the secret) is set only in the answer
// to POST /keys; Prefix names the key in logs and the access audit.
type Key struct {
	ID            string     `json:"id"`
	Key           string     `json:"key,omitempty"`
	Prefix        string     `json:"prefix"`
	Name          string     `json:"name"`
	Role          string     `json:"role"`
	UserID        string     `json:"user_id"`
	WorkspaceID   string     `json:"workspace_id"`
	CreatedAt     time.Time  `json:"created_at"`
	ExpiresAt     *time.Time `json:"expires_at"`
	RevokedAt     *time.Time `json:"revoked_at,omitempty"`
	InstanceAdmin bool       `json:"instance_admin,omitempty"`
}

// KeyList is the answer to GET /keys.
type KeyList struct {
	Keys []Key `json:"keys"`
}

// UserRef and WorkspaceRef name a user and a workspace in WhoAmI.
type (
	UserRef struct {
		ID    string `json:"id"`
		Name  string `json:"name"`
		Email string `json:"email,omitempty"`
	}
	WorkspaceRef struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
)

// WhoAmI is the answer to GET /whoami: who the caller's key acts as.
type WhoAmI struct {
	User          UserRef      `json:"user"`
	Workspace     WorkspaceRef `json:"workspace"`
	Role          string       `json:"role"`
	KeyPrefix     string       `json:"key_prefix"`
	InstanceAdmin bool         `json:"instance_admin"`
}

// AccessRecord is one entry of the access audit. Action is empty for a
// request record and names the event otherwise (key.create, key.revoke,
// user.create, user.delete, workspace.create, workspace.delete,
// share.grant, quota.set, ...). It never holds a key, a secret value, a
// query value or a request body.
type AccessRecord struct {
	Seq          int64     `json:"seq"`
	Time         time.Time `json:"time"`
	WorkspaceID  string    `json:"workspace_id"`
	UserID       string    `json:"user_id"`
	KeyPrefix    string    `json:"key_prefix"`
	Action       string    `json:"action,omitempty"`
	Method       string    `json:"method,omitempty"`
	Route        string    `json:"route,omitempty"`
	ResourceKind string    `json:"resource_kind,omitempty"`
	Resource     string    `json:"resource,omitempty"`
	Sandbox      string    `json:"sandbox,omitempty"`
	Status       int       `json:"status"`
	Remote       string    `json:"remote,omitempty"`
	RequestID    string    `json:"request_id,omitempty"`
}

// AccessList is a page of the access audit, oldest first; NextCursor
// (nil on the last page) is the cursor of the next.
type AccessList struct {
	Items      []AccessRecord `json:"items"`
	NextCursor *string        `json:"next_cursor"`
}

package protocol

import "time"

// Share access levels (Cubicle extension): read lets the grantee see the
// resource (get, status, list, diff, egress log, downloads, file search,
// service URLs); use also lets it run commands, upload, stop, start, fork
// and capture (for a snapshot: create sandboxes from it).
const (
	ShareRead = "read"
	ShareUse  = "use"
)

// ShareGranteeWorkspace is Share.Grantee of a share with the whole
// workspace.
const ShareGranteeWorkspace = "*"

// ShareRequest is the body of POST /boxes/{name}/shares and POST
// /snapshots/{id}/shares: a user of the workspace ({"user_id": "u1",
// "access": "use"}) or the whole workspace ({"workspace": true, "access":
// "read"}), exactly one of the two. Granting again to the same grantee
// changes its access.
type ShareRequest struct {
	UserID    string `json:"user_id,omitempty"`
	Workspace bool   `json:"workspace,omitempty"`
	Access    string `json:"access"`
}

// Share is one grant on a sandbox or snapshot.
type Share struct {
	ID string `json:"id"`
	// ResourceKind is "sandbox" or "snapshot"; ResourceID its id.
	ResourceKind string `json:"resource_kind"`
	ResourceID   string `json:"resource_id"`
	// Grantee is a user id, or ShareGranteeWorkspace.
	Grantee   string    `json:"grantee"`
	Access    string    `json:"access"`
	CreatedBy string    `json:"created_by"`
	CreatedAt time.Time `json:"created_at"`
}

// ShareList is the body of GET /boxes/{name}/shares and GET
// /snapshots/{id}/shares, oldest first.
type ShareList struct {
	Shares []Share `json:"shares"`
}

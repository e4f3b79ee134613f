package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/identity"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// WithIdentity serves workspaces, users, keys, whoami and the access
// audit (protocol/tenancy.go) from svc.
func WithIdentity(svc *identity.Service) Option {
	return func(s *Server) {
		if svc != nil {
			s.ident = svc
		}
	}
}

// registerTenancyRoutes mounts the identity API under every prefix. The
// workspace_id query parameter of the user and key routes selects another
// workspace (instance admin only).
func (s *Server) registerTenancyRoutes() {
	if s.ident == nil {
		return
	}
	for _, p := range prefixes {
		s.handle("POST "+p+"/workspaces", jsonHandler(http.StatusCreated, nil, s.createWorkspace))
		s.handle("GET "+p+"/workspaces", jsonHandler(http.StatusOK, nil, s.listWorkspaces))
		s.handle("GET "+p+"/workspaces/{id}", jsonHandler(http.StatusOK, nil, s.getWorkspace))
		s.handle("DELETE "+p+"/workspaces/{id}", jsonHandler(http.StatusOK, nil, s.deleteWorkspace))
		s.handle("POST "+p+"/users", jsonHandler(http.StatusCreated, nil, s.createUser))
		s.handle("GET "+p+"/users", jsonHandler(http.StatusOK, nil, s.listUsers))
		s.handle("GET "+p+"/users/{id}", jsonHandler(http.StatusOK, nil, s.getUser))
		s.handle("DELETE "+p+"/users/{id}", jsonHandler(http.StatusOK, nil, s.deleteUser))
		s.handle("POST "+p+"/keys", jsonHandler(http.StatusCreated, nil, s.createKey))
		s.handle("GET "+p+"/keys", jsonHandler(http.StatusOK, nil, s.listKeys))
		s.handle("DELETE "+p+"/keys/{id}", jsonHandler(http.StatusOK, nil, s.revokeKey))
		s.handle("GET "+p+"/whoami", jsonHandler(http.StatusOK, nil, s.whoami))
		s.handle("GET "+p+"/audit/access", jsonHandler(http.StatusOK, nil, s.accessAudit))
	}
}

func workspaceJSON(w *store.Workspace) protocol.Workspace {
	return protocol.Workspace{ID: w.ID, Name: w.Name, CreatedAt: w.CreatedAt}
}

func userJSON(u *store.User) protocol.User {
	return protocol.User{ID: u.ID, WorkspaceID: u.WorkspaceID, Name: u.Name, Email: u.Email, CreatedAt: u.CreatedAt}
}

// keyJSON describes k without its secret or hash.
func keyJSON(k *store.APIKey) protocol.Key {
	return protocol.Key{ID: k.ID, Prefix: k.Prefix, Name: k.Name, Role: k.Role, UserID: k.User, WorkspaceID: k.WorkspaceID,
		CreatedAt: k.CreatedAt, ExpiresAt: k.ExpiresAt, RevokedAt: k.RevokedAt, InstanceAdmin: k.InstanceAdmin}
}

// mapAll converts a list with f.
func mapAll[T, U any](in []T, f func(T) U) []U {
	out := make([]U, 0, len(in))
	for _, v := range in {
		out = append(out, f(v))
	}
	return out
}

func (s *Server) createWorkspace(r *http.Request, req protocol.CreateWorkspaceRequest) (protocol.Workspace, error) {
	w, err := s.ident.CreateWorkspace(r.Context(), req)
	if err != nil {
		return protocol.Workspace{}, err
	}
	return workspaceJSON(w), nil
}

func (s *Server) listWorkspaces(r *http.Request, _ none) (protocol.WorkspaceList, error) {
	ws, err := s.ident.Workspaces(r.Context())
	return protocol.WorkspaceList{Workspaces: mapAll(ws, workspaceJSON)}, err
}

func (s *Server) getWorkspace(r *http.Request, _ none) (protocol.Workspace, error) {
	w, err := s.ident.Workspace(r.Context(), r.PathValue("id"))
	if err != nil {
		return protocol.Workspace{}, err
	}
	return workspaceJSON(w), nil
}

func (s *Server) deleteWorkspace(r *http.Request, _ none) (noContent, error) {
	return noContent{}, s.ident.DeleteWorkspace(r.Context(), r.PathValue("id"))
}

// workspaceParam is the workspace_id query parameter ("" if absent).
func workspaceParam(r *http.Request) string { return r.URL.Query().Get("workspace_id") }

func (s *Server) createUser(r *http.Request, req protocol.CreateUserRequest) (protocol.User, error) {
	u, err := s.ident.CreateUser(r.Context(), req)
	if err != nil {
		return protocol.User{}, err
	}
	return userJSON(u), nil
}

func (s *Server) listUsers(r *http.Request, _ none) (protocol.UserList, error) {
	us, err := s.ident.Users(r.Context(), workspaceParam(r))
	return protocol.UserList{Users: mapAll(us, userJSON)}, err
}

func (s *Server) getUser(r *http.Request, _ none) (protocol.User, error) {
	u, err := s.ident.User(r.Context(), workspaceParam(r), r.PathValue("id"))
	if err != nil {
		return protocol.User{}, err
	}
	return userJSON(u), nil
}

func (s *Server) deleteUser(r *http.Request, _ none) (noContent, error) {
	return noContent{}, s.ident.DeleteUser(r.Context(), workspaceParam(r), r.PathValue("id"))
}

func (s *Server) createKey(r *http.Request, req protocol.CreateKeyRequest) (protocol.Key, error) {
	k, err := s.ident.CreateKey(r.Context(), req)
	if err != nil {
		return protocol.Key{}, err
	}
	out := keyJSON(&k.APIKey)
	out.Key = k.Secret
	return out, nil
}

func (s *Server) listKeys(r *http.Request, _ none) (protocol.KeyList, error) {
	ks, err := s.ident.Keys(r.Context(), workspaceParam(r))
	return protocol.KeyList{Keys: mapAll(ks, keyJSON)}, err
}

func (s *Server) revokeKey(r *http.Request, _ none) (noContent, error) {
	return noContent{}, s.ident.RevokeKey(r.Context(), workspaceParam(r), r.PathValue("id"))
}

func (s *Server) whoami(r *http.Request, _ none) (protocol.WhoAmI, error) {
	me, err := s.ident.WhoAmI(r.Context())
	if err != nil {
		return protocol.WhoAmI{}, err
	}
	p := caller(r)
	return protocol.WhoAmI{
		User:      protocol.UserRef{ID: me.User.ID, Name: me.User.Name, Email: me.User.Email},
		Workspace: protocol.WorkspaceRef{ID: me.Workspace.ID, Name: me.Workspace.Name},
		Role:      p.Role, KeyPrefix: p.KeyPrefix, InstanceAdmin: p.InstanceAdmin,
	}, nil
}

// accessQuery parses the access audit's query: sandbox, user, since (RFC
// 3339), cursor (from next_cursor), limit (1..500, default 100) and
// workspace_id.
func (s *Server) accessQuery(r *http.Request) (store.AccessQuery, error) {
	v := r.URL.Query()
	q := store.AccessQuery{WorkspaceID: v.Get("workspace_id"), User: v.Get("user"), Limit: 100}
	if t := v.Get("since"); t != "" {
		since, err := time.Parse(time.RFC3339Nano, t)
		if err != nil {
			return q, errdefs.Field("since", "must be an RFC 3339 time")
		}
		q.Since = since
	}
	if c := v.Get("cursor"); c != "" {
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil || n < 0 {
			return q, errdefs.Field("cursor", "must be a next_cursor this endpoint returned")
		}
		q.After = n
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 500 {
			return q, errdefs.Field("limit", "must be an integer between 1 and 500")
		}
		q.Limit = n
	}
	if sb := v.Get("sandbox"); sb != "" {
		// Records name a sandbox as the path did: by name on the control
		// plane, by id on the dataplane. Match both when it still exists.
		q.Sandboxes = []string{sb}
		if found, err := s.mgr.GetSandbox(r.Context(), sb); err == nil {
			q.Sandboxes = append(q.Sandboxes, found.ID, found.Name)
		}
	}
	return q, nil
}

func (s *Server) accessAudit(r *http.Request, _ none) (protocol.AccessList, error) {
	q, err := s.accessQuery(r)
	if err != nil {
		return protocol.AccessList{}, err
	}
	recs, err := s.ident.Access(r.Context(), q)
	if err != nil {
		return protocol.AccessList{}, err
	}
	out := protocol.AccessList{Items: mapAll(recs, accessJSON)}
	if len(recs) == q.Limit {
		c := strconv.FormatInt(recs[len(recs)-1].Seq, 10)
		out.NextCursor = &c
	}
	return out, nil
}

func accessJSON(a store.AccessRecord) protocol.AccessRecord {
	return protocol.AccessRecord{Seq: a.Seq, Time: a.Time, WorkspaceID: a.WorkspaceID, UserID: a.UserID, KeyPrefix: a.KeyPrefix,
		Action: a.Action, Method: a.Method, Route: a.Route, ResourceKind: a.ResourceKind, Resource: a.Resource,
		Sandbox: a.Sandbox, Status: a.Status, Remote: a.Remote, RequestID: a.RequestID}
}

package api

import (
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// registerShareRoutes adds sharing (a Cubicle extension): the owner of a
// sandbox or snapshot (its creator, or a workspace admin) grants, lists and
// revokes read or use access (internal/authz has the levels).
func (s *Server) registerShareRoutes() {
	for _, p := range prefixes {
		for _, res := range []struct{ path, kind string }{
			{p + "/boxes/{name}/shares", store.ShareSandbox},
			{p + "/snapshots/{name}/shares", store.ShareSnapshot},
		} {
			kind := res.kind
			s.handle("POST "+res.path, jsonHandler(http.StatusCreated, nil, func(r *http.Request, req protocol.ShareRequest) (protocol.Share, error) {
				sh, err := s.mgr.Share(r.Context(), kind, r.PathValue("name"), sandbox.ShareRequest{UserID: req.UserID, Workspace: req.Workspace, Access: req.Access})
				if err != nil {
					return protocol.Share{}, err
				}
				return shareJSON(sh), nil
			}))
			s.handle("GET "+res.path, jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (protocol.ShareList, error) {
				list, err := s.mgr.ListShares(r.Context(), kind, r.PathValue("name"))
				if err != nil {
					return protocol.ShareList{}, err
				}
				out := protocol.ShareList{Shares: make([]protocol.Share, len(list))}
				for i, sh := range list {
					out.Shares[i] = shareJSON(sh)
				}
				return out, nil
			}))
			s.handle("DELETE "+res.path+"/{id}", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (noContent, error) {
				return noContent{}, s.mgr.Unshare(r.Context(), kind, r.PathValue("name"), r.PathValue("id"))
			}))
		}
	}
}

func shareJSON(sh *store.Share) protocol.Share {
	return protocol.Share{ID: sh.ID, ResourceKind: sh.ResourceKind, ResourceID: sh.ResourceID, Grantee: sh.Grantee,
		Access: sh.Access, CreatedBy: sh.CreatedBy, CreatedAt: sh.CreatedAt}
}

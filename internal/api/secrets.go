package api

import (
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/secrets"
)

// egressAPI serves workspace secrets (values the egress proxy injects as
// headers; write-only) and each sandbox's egress log.
type egressAPI struct {
	s      *Server
	vault  *secrets.Vault
	egress *proxy.Service
}

// EnableEgress serves, under every control-plane prefix:
//
//	PUT    /secrets/{name}            {"value": "...", "members_may_use"?: bool} → {name, members_may_use, created_at, updated_at}
//	GET    /secrets                   {"secrets": [{name, members_may_use, created_at, updated_at}]}
//	DELETE /secrets/{name}
//	GET    /boxes/{name}/egress-log   counters and recent decisions
//
// Secret values are never returned. PUT and DELETE are for admins; GET
// lists what the caller may reference in a proxy rule (secrets.Vault.MayUse):
// everything for admins, the members_may_use secrets for members. Call it
// before serving.
func (s *Server) EnableEgress(vault *secrets.Vault, egress *proxy.Service) {
	e := &egressAPI{s: s, vault: vault, egress: egress}
	for _, p := range prefixes {
		s.handle("PUT "+p+"/secrets/{name}", e.putSecret)
		s.handle("GET "+p+"/secrets", e.listSecrets)
		s.handle("DELETE "+p+"/secrets/{name}", e.deleteSecret)
		s.handle("GET "+p+"/boxes/{name}/egress-log", e.egressLog)
	}
}

// secretAdmin returns the caller's workspace if the caller may manage its
// secrets: workspace admins only, since a secret is usable by every
// sandbox of the workspace.
func secretAdmin(r *http.Request) (string, error) {
	p, ok := auth.FromContext(r.Context())
	if !ok {
		return "", fmt.Errorf("no principal: %w", errdefs.ErrUnauthorized)
	}
	if !p.IsAdmin() {
		return "", fmt.Errorf("managing workspace secrets needs the admin role: %w", errdefs.ErrForbidden)
	}
	return p.WorkspaceID, nil
}

func (e *egressAPI) putSecret(w http.ResponseWriter, r *http.Request) {
	ws, err := secretAdmin(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	name := r.PathValue("name")
	if !proxy.ValidSecretName(name) {
		writeError(r.Context(), w, errdefs.Field("name", "must be 1-128 of [A-Za-z0-9_], not starting with a digit"))
		return
	}
	var req struct {
		Value         *string `json:"value"`
		MembersMayUse bool    `json:"members_may_use"`
	}
	if err := decode(r, &req); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if req.Value == nil {
		writeError(r.Context(), w, errdefs.Field("value", "is required"))
		return
	}
	info, err := e.vault.Put(r.Context(), ws, name, []byte(*req.Value), req.MembersMayUse)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (e *egressAPI) listSecrets(w http.ResponseWriter, r *http.Request) {
	p, ok := auth.FromContext(r.Context())
	if !ok {
		writeError(r.Context(), w, fmt.Errorf("no principal: %w", errdefs.ErrUnauthorized))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": e.vault.List(r.Context(), p)})
}

func (e *egressAPI) deleteSecret(w http.ResponseWriter, r *http.Request) {
	ws, err := secretAdmin(r)
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	if err := e.vault.Delete(r.Context(), ws, r.PathValue("name")); err != nil {
		writeError(r.Context(), w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// egressLog returns a sandbox's egress counters and recent decisions; the
// caller must be able to see the sandbox.
func (e *egressAPI) egressLog(w http.ResponseWriter, r *http.Request) {
	sb, err := e.s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(r.Context(), w, err)
		return
	}
	writeJSON(w, http.StatusOK, e.egress.Log(sb.ID))
}

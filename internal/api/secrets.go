package api

import (
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/secrets"
)

// egressAPI serves workspace secrets (values the egress proxy injects as
// headers; write-only) and each sandbox's egress log.
type egressAPI struct {
	s      *Server
	vault  Vault
	egress EgressLogs
}

// EnableEgress serves, under every control-plane prefix:
//
//	PUT    /secrets/{name}            {"value": "...", "members_may_use"?: bool} → {name, members_may_use, created_at, updated_at}
//	GET    /secrets                   {"secrets": [{name, members_may_use, created_at, updated_at}]}
//	DELETE /secrets/{name}
//	GET    /boxes/{name}/egress-log   counters and recent decisions
//
// Secret values are never returned. PUT and DELETE are for admins
// (authz.ManageSecrets); GET lists what the caller may reference in a proxy
// rule (authz.MayUseSecret). Call it before serving.
func (s *Server) EnableEgress(vault *secrets.Vault, egress *proxy.Service) {
	s.enableEgress(vault, egress)
}

func (s *Server) enableEgress(vault Vault, egress EgressLogs) {
	e := &egressAPI{s: s, vault: vault, egress: egress}
	for _, p := range prefixes {
		s.handle("PUT "+p+"/secrets/{name}", jsonHandler(http.StatusOK, nil, e.putSecret))
		s.handle("GET "+p+"/secrets", jsonHandler(http.StatusOK, nil, e.listSecrets))
		s.handle("DELETE "+p+"/secrets/{name}", jsonHandler(http.StatusOK, nil, e.deleteSecret))
		s.handle("GET "+p+"/boxes/{name}/egress-log", jsonHandler(http.StatusOK, nil, e.egressLog))
	}
}

// putSecretRequest is the body of PUT /secrets/{name}.
type putSecretRequest struct {
	Value         *string `json:"value"`
	MembersMayUse bool    `json:"members_may_use"`
}

func (e *egressAPI) putSecret(r *http.Request, req putSecretRequest) (secrets.SecretInfo, error) {
	p, err := admin(r, authz.ManageSecrets)
	if err != nil {
		return secrets.SecretInfo{}, err
	}
	name := r.PathValue("name")
	if !proxy.ValidSecretName(name) {
		return secrets.SecretInfo{}, errdefs.Field("name", "must be 1-128 of [A-Za-z0-9_], not starting with a digit")
	}
	if req.Value == nil {
		return secrets.SecretInfo{}, errdefs.Field("value", "is required")
	}
	return e.vault.Put(r.Context(), p.WorkspaceID, name, []byte(*req.Value), req.MembersMayUse)
}

// secretList is the body of GET /secrets.
type secretList struct {
	Secrets []secrets.SecretInfo `json:"secrets"`
}

func (e *egressAPI) listSecrets(r *http.Request, _ none) (secretList, error) {
	return secretList{Secrets: e.vault.List(r.Context(), caller(r))}, nil
}

func (e *egressAPI) deleteSecret(r *http.Request, _ none) (noContent, error) {
	p, err := admin(r, authz.ManageSecrets)
	if err != nil {
		return noContent{}, err
	}
	return noContent{}, e.vault.Delete(r.Context(), p.WorkspaceID, r.PathValue("name"))
}

// egressLog returns a sandbox's egress counters and recent decisions; the
// caller must be able to see the sandbox.
func (e *egressAPI) egressLog(r *http.Request, _ none) (proxy.Report, error) {
	sb, err := e.s.mgr.GetSandbox(r.Context(), r.PathValue("name"))
	if err != nil {
		return proxy.Report{}, err
	}
	return e.egress.Log(sb.ID), nil
}

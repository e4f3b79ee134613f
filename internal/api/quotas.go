package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/authz"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Quotas is what the quota routes call on the sandbox manager.
type Quotas interface {
	WorkspaceQuota(ctx context.Context, ws string) (store.Quota, error)
	SetWorkspaceQuota(ctx context.Context, ws string, q store.Quota) error
	WorkspaceUsage(ctx context.Context, ws string) (store.Usage, int64, error)
}

// QuotaAudit records a quota change (the access audit implements it).
type QuotaAudit interface {
	QuotaChanged(ctx context.Context, p auth.Principal, workspaceID string, q protocol.Quota)
}

type quotaAPI struct {
	quotas Quotas
	audit  QuotaAudit // nil: changes are not recorded
}

// EnableQuotas serves workspace quotas and usage from q under every
// control-plane prefix, recording changes in audit (which may be nil).
// Call it before serving.
func (s *Server) EnableQuotas(q Quotas, audit QuotaAudit) {
	qa := &quotaAPI{quotas: q, audit: audit}
	for _, p := range prefixes {
		s.handle("GET "+p+"/workspaces/{id}/quotas", jsonHandler(http.StatusOK, nil, qa.getQuota))
		s.handle("PUT "+p+"/workspaces/{id}/quotas", jsonHandler(http.StatusOK, checkQuota, qa.putQuota))
		s.handle("GET "+p+"/workspaces/{id}/usage", jsonHandler(http.StatusOK, nil, qa.getUsage))
	}
}

func (qa *quotaAPI) getQuota(r *http.Request, _ none) (protocol.WorkspaceQuota, error) {
	ws := r.PathValue("id")
	if err := authz.ReadQuota(caller(r), ws); err != nil {
		return protocol.WorkspaceQuota{}, err
	}
	q, err := qa.quotas.WorkspaceQuota(r.Context(), ws)
	if err != nil {
		return protocol.WorkspaceQuota{}, err
	}
	return protocol.WorkspaceQuota{WorkspaceID: ws, Quota: protocol.Quota{MaxSandboxes: q.MaxSandboxes, MaxVCPUs: q.MaxVCPUs,
		MaxMemBytes: q.MaxMemBytes, MaxStorageBytes: q.MaxStorageBytes, MaxSnapshots: q.MaxSnapshots}}, nil
}

// checkQuota refuses a negative ceiling, naming its member.
func checkQuota(q *protocol.Quota) error {
	for _, f := range []struct {
		name string
		v    *int64
	}{{"max_sandboxes", q.MaxSandboxes}, {"max_vcpus", q.MaxVCPUs}, {"max_mem_bytes", q.MaxMemBytes},
		{"max_storage_bytes", q.MaxStorageBytes}, {"max_snapshots", q.MaxSnapshots}} {
		if f.v != nil && *f.v < 0 {
			return errdefs.Field(f.name, "must be 0 or more, or null for unlimited")
		}
	}
	return nil
}

func (qa *quotaAPI) putQuota(r *http.Request, q protocol.Quota) (protocol.WorkspaceQuota, error) {
	ws, p := r.PathValue("id"), caller(r)
	if err := authz.SetQuota(p, ws); err != nil {
		return protocol.WorkspaceQuota{}, err
	}
	if err := qa.quotas.SetWorkspaceQuota(r.Context(), ws, store.Quota{MaxSandboxes: q.MaxSandboxes, MaxVCPUs: q.MaxVCPUs,
		MaxMemBytes: q.MaxMemBytes, MaxStorageBytes: q.MaxStorageBytes, MaxSnapshots: q.MaxSnapshots}); err != nil {
		return protocol.WorkspaceQuota{}, err
	}
	if qa.audit != nil {
		qa.audit.QuotaChanged(r.Context(), p, ws, q)
	}
	return protocol.WorkspaceQuota{WorkspaceID: ws, Quota: q}, nil
}

func (qa *quotaAPI) getUsage(r *http.Request, _ none) (protocol.Usage, error) {
	ws := r.PathValue("id")
	if err := authz.ReadQuota(caller(r), ws); err != nil {
		return protocol.Usage{}, err
	}
	u, used, err := qa.quotas.WorkspaceUsage(r.Context(), ws)
	if err != nil {
		return protocol.Usage{}, err
	}
	return protocol.Usage{WorkspaceID: ws, Sandboxes: u.Sandboxes, VCPUs: u.VCPUs, MemBytes: u.MemBytes,
		StorageBytes: u.StorageBytes, Snapshots: u.Snapshots, FSUsedBytes: used}, nil
}

package api

import (
	"context"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// Pools is what the warm-pool routes call on the sandbox manager.
type Pools interface {
	SetPool(ctx context.Context, snapshot string, size, maxAgeSeconds int64) (sandbox.PoolStatus, error)
	Pool(ctx context.Context, snapshot string) (sandbox.PoolStatus, error)
}

// EnablePools serves snapshots' warm pools from p under every
// control-plane prefix. Call it before serving.
func (s *Server) EnablePools(p Pools) {
	for _, pre := range prefixes {
		s.handle("GET "+pre+"/snapshots/{id}/pool", jsonHandler(http.StatusOK, nil, func(r *http.Request, _ none) (protocol.SnapshotPool, error) {
			st, err := p.Pool(r.Context(), r.PathValue("id"))
			return poolJSON(st), err
		}))
		s.handle("PUT "+pre+"/snapshots/{id}/pool", jsonHandler(http.StatusOK, checkPool, func(r *http.Request, req protocol.SetSnapshotPoolRequest) (protocol.SnapshotPool, error) {
			st, err := p.SetPool(r.Context(), r.PathValue("id"), req.Size, req.MaxAgeSeconds)
			return poolJSON(st), err
		}))
	}
}

// checkPool refuses negative members, naming them.
func checkPool(req *protocol.SetSnapshotPoolRequest) error {
	if req.Size < 0 {
		return errdefs.Field("size", "must not be negative")
	}
	if req.MaxAgeSeconds < 0 {
		return errdefs.Field("max_age_seconds", "must not be negative")
	}
	return nil
}

func poolJSON(st sandbox.PoolStatus) protocol.SnapshotPool {
	return protocol.SnapshotPool{SnapshotID: st.SnapshotID, Size: st.Size, MaxAgeSeconds: st.MaxAgeSeconds, Ready: st.Ready}
}

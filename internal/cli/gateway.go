package cli

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/gateway"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
)

// newGateway loads (or creates) the signing key and builds the service
// gateway that serves service URLs and download links.
func newGateway(ctx context.Context, f serveFlags, public string, mgr *sandbox.Manager, authn *auth.Authenticator, users gateway.Users, ids *jwtkeys.Signer, log *slog.Logger) (*gateway.Gateway, error) {
	keyPath := f.signingKey
	if keyPath == "" {
		keyPath = filepath.Join(f.dataDir, "signing.key")
	}
	key, err := gateway.LoadOrCreateKey(ctx, keyPath, log)
	if err != nil {
		return nil, err
	}
	signer, err := gateway.NewSigner(key)
	if err != nil {
		return nil, err
	}
	return gateway.New(gateway.Config{PublicURL: public, ServiceDomain: f.serviceDomain, Signer: signer,
		Sandboxes: mgr, Auth: authn, Users: users, Identity: ids, WriteError: api.WriteError, Logger: log})
}

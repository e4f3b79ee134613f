package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/registry"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/gvisor"
	"github.com/cubicle-dev/cubicle/internal/runtime/namespace"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/secrets"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/spf13/cobra"
)

// serveFlags are the daemon's settings.
type serveFlags struct {
	listen             string
	dataDir            string
	publicURL          string
	runtime            string
	runsc              string
	insecureRegistries []string
	debug              bool
	serviceDomain      string
	signingKey         string
	reapInterval       time.Duration
	ttlGranularity     time.Duration
	execOutputLimit    int
	egress             egressFlags
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the Cubicle daemon (API, sandbox manager, image store)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return serve(ctx, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", "127.0.0.1:8080", "address to serve the API on")
	addEgressFlags(fl, &f.egress)
	fl.StringVar(&f.dataDir, "data-dir", "/var/lib/cubicle", "directory for state, images and sandbox filesystems")
	fl.StringVar(&f.publicURL, "public-url", "", "externally reachable base URL (default http://<listen>)")
	fl.StringVar(&f.runtime, "runtime", "gvisor", "sandbox runtime: gvisor or namespace")
	fl.StringVar(&f.runsc, "runsc", "", "path of runsc (default: next to cubicle, then PATH)")
	fl.StringSliceVar(&f.insecureRegistries, "insecure-registry", nil, "HOST[:PORT] of a registry reached over plain HTTP (repeatable)")
	fl.BoolVar(&f.debug, "debug", false, "log every request")
	fl.StringVar(&f.serviceDomain, "service-domain", os.Getenv("CUBICLE_SERVICE_DOMAIN"),
		"domain for host-form service URLs <name>--<port>.<domain> (wildcard DNS to this daemon); unset: path form only (env CUBICLE_SERVICE_DOMAIN)")
	fl.StringVar(&f.signingKey, "signing-key", "", "hex key file signing service tokens and download links, created 0600 if missing (default <data-dir>/signing.key)")
	fl.DurationVar(&f.reapInterval, "reap-interval", envDuration("CUBICLE_REAP_INTERVAL", 10*time.Second),
		"how often idle_ttl_seconds and delete_after_stop_seconds are enforced (env CUBICLE_REAP_INTERVAL)")
	fl.DurationVar(&f.ttlGranularity, "ttl-granularity", envDuration("CUBICLE_TTL_GRANULARITY", time.Minute),
		"unit TTLs must be multiples of; the protocol's is 1m, lower it only for tests (env CUBICLE_TTL_GRANULARITY)")
	fl.IntVar(&f.execOutputLimit, "exec-output-limit", api.DefaultExecOutputLimit,
		"bytes of each output stream POST /execute returns; the rest is dropped and the result marked truncated (WebSocket exec streams everything)")
	return cmd
}

// envDuration reads a flag default from the environment, so test harnesses
// can set daemon knobs without changing its command line.
func envDuration(name string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(name)); err == nil && d > 0 {
		return d
	}
	return def
}

func serve(ctx context.Context, f serveFlags) error {
	level := slog.LevelInfo
	if f.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	st, err := store.OpenSQLite(ctx, filepath.Join(f.dataDir, "cubicle.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	if err := bootstrapKey(ctx, st, f.dataDir); err != nil {
		return err
	}
	images, err := image.NewStore(filepath.Join(f.dataDir, "images"), image.WithInsecureRegistries(f.insecureRegistries), image.WithLogger(log))
	if err != nil {
		return err
	}
	cow, err := storage.OpenCoW(ctx, f.dataDir, storage.WithCoWLogger(log))
	if err != nil {
		return err
	}
	log.Info("copy-on-write store", "backend", cow.Backend(), "root", cow.Root())
	overlays, err := storage.New(filepath.Join(f.dataDir, "sandboxes"), storage.WithCoW(cow))
	if err != nil {
		return err
	}
	netmgr, err := network.New(ctx, network.Config{StateDir: filepath.Join(f.dataDir, "network"), Pool: network.DefaultPool()}, network.WithLogger(log))
	if err != nil {
		return err
	}
	driver, err := newDriver(f)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("locate own binary for the agent: %w", err)
	}
	if self, err = filepath.EvalSymlinks(self); err != nil {
		return fmt.Errorf("locate own binary for the agent: %w", err)
	}
	box, err := secrets.LoadOrCreate(filepath.Join(f.dataDir, "secrets.key"))
	if err != nil {
		return err
	}
	registries := registry.New(st, box)
	egress, vault, err := newEgress(ctx, f.egress, f.dataDir, netmgr, box, log)
	if err != nil {
		return err
	}
	defer egress.Close()
	mgr := sandbox.New(sandbox.Config{Store: st, Images: images, Storage: overlays, Network: netmgr, Driver: driver, AgentBinary: self, Logger: log,
		Credentials: registries, ReapInterval: f.reapInterval, TTLGranularity: f.ttlGranularity, Egress: egress})
	if err := mgr.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	public := f.publicURL
	if public == "" {
		public = "http://" + ln.Addr().String()
	}
	authn := auth.New(st)
	gw, err := newGateway(ctx, f, public, mgr, authn, log)
	if err != nil {
		return err
	}
	handler := api.New(mgr, authn, images, public, log, api.WithGateway(gw), api.WithExecOutputLimit(f.execOutputLimit))
	handler.EnableRegistries(registries)
	handler.EnableEgress(vault, egress)
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 30 * time.Second}
	go mgr.RunReaper(ctx)
	log.Info("cubicle serving", "listen", ln.Addr().String(), "public_url", public, "runtime", driver.Name(), "data_dir", f.dataDir)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Sandboxes keep running across a daemon restart; only the API stops.
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func newDriver(f serveFlags) (runtime.Driver, error) {
	stateDir := filepath.Join(f.dataDir, "runtime", f.runtime)
	switch f.runtime {
	case "gvisor":
		runsc, err := gvisor.FindRunsc(f.runsc)
		if err != nil {
			return nil, err
		}
		return gvisor.New(runsc, stateDir)
	case "namespace":
		return namespace.New(stateDir)
	default:
		return nil, fmt.Errorf("unknown --runtime %q (want gvisor or namespace)", f.runtime)
	}
}

// bootstrapKey creates the default workspace's admin key on a fresh data
// dir: CUBICLE_BOOTSTRAP_API_KEY if set, else a generated key that is
// printed once and written to <data-dir>/admin.key (0600).
func bootstrapKey(ctx context.Context, st store.Store, dataDir string) error {
	given := os.Getenv("CUBICLE_BOOTSTRAP_API_KEY")
	key, err := auth.Bootstrap(ctx, st, given)
	if err != nil {
		return fmt.Errorf("bootstrap admin key: %w", err)
	}
	if key == "" || given != "" {
		return nil
	}
	path := filepath.Join(dataDir, "admin.key")
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fmt.Fprintf(os.Stderr, "Generated admin API key (also in %s):\n%s\n", path, key)
	return nil
}

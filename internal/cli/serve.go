package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accesslog"
	"github.com/cubicle-dev/cubicle/internal/api"
	"github.com/cubicle-dev/cubicle/internal/auth"
	"github.com/cubicle-dev/cubicle/internal/blueprint"
	"github.com/cubicle-dev/cubicle/internal/e2b"
	"github.com/cubicle-dev/cubicle/internal/fault"
	"github.com/cubicle-dev/cubicle/internal/filerec"
	"github.com/cubicle-dev/cubicle/internal/health"
	"github.com/cubicle-dev/cubicle/internal/identity"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/jwtkeys"
	cubiclemcp "github.com/cubicle-dev/cubicle/internal/mcp"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/proxy"
	"github.com/cubicle-dev/cubicle/internal/record"
	"github.com/cubicle-dev/cubicle/internal/registry"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/gvisor"
	"github.com/cubicle-dev/cubicle/internal/runtime/microvm"
	"github.com/cubicle-dev/cubicle/internal/runtime/namespace"
	"github.com/cubicle-dev/cubicle/internal/sandbox"
	"github.com/cubicle-dev/cubicle/internal/secrets"
	"github.com/cubicle-dev/cubicle/internal/storage"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/telemetry"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"
)

// serveFlags are the daemon's settings.
type serveFlags struct {
	listen             string
	dataDir            string
	publicURL          string
	runtime            string
	runsc              string
	qemu               string
	guestKernel        string
	microvmAccel       string
	insecureRegistries []string
	debug              bool
	serviceDomain      string
	signingKey         string
	reapInterval       time.Duration
	poolDefault        int64
	ttlGranularity     time.Duration
	execOutputLimit    int
	auditRetention     time.Duration
	auditOutputCap     int
	auditFiles         bool
	auditExport        auditExportFlags
	egress             egressFlags
	gcsEndpoint        string
	mountsLoopback     bool
	hostResolv         string
	conns              api.ConnLimits
	imageMaxBytes      string
	layerMaxBytes      string
	buildCacheBytes    string
	metricsListen      string
	e2bListen          string
	rateLimit          api.RateLimit
	storeReserve       string
	maxBoots           int
	bootQueue          int
	memReserve         string
	defaultImage       string
	blueprintCache     string
}

// imageLimits parses the image size caps ("" is 0: the store's default).
func (f serveFlags) imageLimits() (image.Limits, error) {
	var l image.Limits
	for _, v := range []struct {
		flag, val string
		dst       *int64
	}{{"--image-max-bytes", f.imageMaxBytes, &l.ImageBytes}, {"--image-layer-max-bytes", f.layerMaxBytes, &l.LayerBytes}} {
		n, err := parseSize(v.flag, v.val)
		if err != nil {
			return l, err
		}
		*v.dst = n
	}
	return l, nil
}

// spaceGuardInterval is how often sandboxes' write limits are fitted to
// the store's free space (and at once after each boot's Limit).
const spaceGuardInterval = 2 * time.Second

// healthChecks are the parts /healthz probes: the database, the CoW store's
// space and writability, each runtime (when its driver can tell) and the
// egress proxy. The proxy is not critical: sandboxes without egress rules
// still work without it. Nor is a runtime other than the default (the
// first, check "runtime"; the others "runtime-<name>"): creates that name
// none still work without it.
func healthChecks(reserve int64, st *store.SQLite, cow *storage.CoW, drivers []runtime.Driver, egress *proxy.Service) *health.Checker {
	checks := []health.Check{
		{Name: "database", Critical: true, Probe: st.Ping},
		{Name: "store", Critical: true, Probe: cow.Check(reserve)},
		{Name: "egress_proxy", Probe: egress.Probe},
	}
	for i, d := range drivers {
		p, ok := d.(runtime.Prober)
		if !ok {
			continue
		}
		if i == 0 {
			checks = append(checks, health.Check{Name: "runtime", Critical: true, Probe: p.Probe})
		} else {
			checks = append(checks, health.Check{Name: "runtime-" + d.Name(), Probe: p.Probe})
		}
	}
	return health.New(checks...)
}

// storeReserveBytes parses --store-reserve (0 allowed: no reserve).
func (f serveFlags) storeReserveBytes() (int64, error) {
	n, err := parseByteSize(f.storeReserve)
	if err != nil {
		return 0, fmt.Errorf("--store-reserve: %w", err)
	}
	return n, nil
}

// parseSize parses a size flag such as 512MiB ("" is 0: the default).
func parseSize(flag, val string) (int64, error) {
	if val == "" {
		return 0, nil
	}
	n, err := humanize.ParseBytes(val)
	if err != nil || n == 0 || n > math.MaxInt64 {
		return 0, fmt.Errorf("%s %q: want a positive size such as 512MiB", flag, val)
	}
	return int64(n), nil
}

func newServeCmd() *cobra.Command {
	var f serveFlags
	f.conns = api.DefaultConnLimits()
	f.rateLimit = api.DefaultRateLimit
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
	fl.StringVar(&f.gcsEndpoint, "mounts-gcs-endpoint", "",
		"base URL of the GCS JSON API that gcs mounts use instead of https://storage.googleapis.com (an emulator, for tests)")
	fl.BoolVar(&f.mountsLoopback, "mounts-allow-loopback", false,
		"let mount endpoints and git remotes be loopback addresses (an object store on this host; tests); link-local and the sandbox pool are always refused")
	fl.StringVar(&f.hostResolv, "host-resolv-conf", "/etc/resolv.conf",
		"resolv.conf whose non-loopback nameservers sandboxes name, and whose nameservers the daemon's resolver for sandboxes with a proxy_config forwards to")
	fl.DurationVar(&f.conns.HeaderTimeout, "http-header-timeout", f.conns.HeaderTimeout,
		"time a client has to send a request's headers once the server waits for them (closes silent and slow-loris connections)")
	fl.DurationVar(&f.conns.IdleTimeout, "http-idle-timeout", f.conns.IdleTimeout, "how long a keep-alive connection may sit between requests")
	fl.IntVar(&f.conns.MaxConnsPerClient, "max-conns-per-client", f.conns.MaxConnsPerClient,
		"open connections allowed per client IPv4 address or IPv6 /64 (more get a 503); 0: no cap. Behind a reverse proxy every client shares its address")
	fl.Float64Var(&f.rateLimit.PerSecond, "rate-limit", f.rateLimit.PerSecond,
		"requests per second allowed per API key, refilling a bucket of --rate-burst (more get a 429 with Retry-After); 0: no limit")
	fl.IntVar(&f.rateLimit.Burst, "rate-burst", f.rateLimit.Burst, "requests an API key may send at once before --rate-limit applies")
	fl.StringVar(&f.dataDir, "data-dir", "/var/lib/cubicle", "directory for state, images and sandbox filesystems")
	fl.StringVar(&f.publicURL, "public-url", "", "externally reachable base URL (default http://<listen>)")
	fl.StringVar(&f.runtime, "runtime", "gvisor",
		"sandbox runtime: gvisor, microvm (QEMU microVMs, each its own kernel) or namespace (trusted work only); a comma list (gvisor,microvm) serves several, the first the default of creates that name none (their \"runtime\" field)")
	fl.StringVar(&f.qemu, "qemu", "", "microvm: path of qemu-system-x86_64 (default: PATH)")
	fl.StringVar(&f.guestKernel, "guest-kernel", "", "microvm: the guest kernel, from make guest-kernel (default: $CUBICLE_GUEST_KERNEL, then vmlinux next to cubicle)")
	fl.StringVar(&f.microvmAccel, "microvm-accel", "", "microvm: kvm or tcg (default: kvm when a probe boot under it is quick, else tcg)")
	fl.StringVar(&f.runsc, "runsc", "", "path of runsc (default: next to cubicle, then PATH)")
	fl.StringSliceVar(&f.insecureRegistries, "insecure-registry", nil, "HOST[:PORT] of a registry reached over plain HTTP (repeatable)")
	fl.StringVar(&f.imageMaxBytes, "image-max-bytes", "", "cap on what one image pull or load unpacks to, e.g. 20GiB (default: half the image store's free space at pull time)")
	fl.StringVar(&f.layerMaxBytes, "image-layer-max-bytes", "", "cap on one unpacked image layer (default: the image cap)")
	fl.StringVar(&f.storeReserve, "store-reserve", "1GiB",
		"space the copy-on-write store keeps free (the smaller of its own free space and, for a loop image, its host filesystem's): below it /healthz is unavailable and creates, starts, forks and captures get a 503; below twice it, degraded. 0: no reserve")
	fl.IntVar(&f.maxBoots, "max-boots", sandbox.DefaultMaxBoots(),
		"sandbox boots (creates, starts, warm-pool refills) that run at once; more wait their turn, up to --boot-queue")
	fl.IntVar(&f.bootQueue, "boot-queue", 0,
		"creates and starts that may wait for a boot slot; past it they get a 503 HostAtCapacity with Retry-After (default 64 per CPU)")
	fl.StringVar(&f.memReserve, "mem-reserve", "1GiB",
		"memory kept for the host: a create, start or warm-pool refill whose mem_bytes exceeds the host's MemAvailable less this gets a 503 HostAtCapacity (0: no reserve)")
	fl.StringVar(&f.buildCacheBytes, "build-cache-size", "", "Dockerfile step cache kept per workspace, least recently used pruned past it, e.g. 20GiB (default 10GiB)")
	fl.BoolVar(&f.debug, "debug", false, "log every request")
	fl.StringVar(&f.e2bListen, "e2b-listen", "",
		"also serve the E2B-compatible API here (control plane and envd): point the e2b SDKs' E2B_API_URL and E2B_SANDBOX_URL at http://<this address>")
	fl.StringVar(&f.metricsListen, "metrics-listen", "",
		"also serve /metrics here without authentication, for a private scrape network (the API's /metrics needs an admin key)")
	fl.StringVar(&f.serviceDomain, "service-domain", os.Getenv("CUBICLE_SERVICE_DOMAIN"),
		"domain for host-form service URLs <name>--<port>.<domain> (wildcard DNS to this daemon); unset: path form only (env CUBICLE_SERVICE_DOMAIN)")
	fl.StringVar(&f.signingKey, "signing-key", "", "hex key file signing service tokens and download links, created 0600 if missing (default <data-dir>/signing.key)")
	fl.Int64Var(&f.poolDefault, "pool-default", -1, "pre-booted instances of the built-in snapshot \"default\" kept for creates to claim (a warm pool; 0 removes it; -1 keeps what the last start set)")
	fl.DurationVar(&f.reapInterval, "reap-interval", envDuration("CUBICLE_REAP_INTERVAL", 10*time.Second),
		"how often idle_ttl_seconds and delete_after_stop_seconds are enforced (env CUBICLE_REAP_INTERVAL)")
	fl.DurationVar(&f.ttlGranularity, "ttl-granularity", envDuration("CUBICLE_TTL_GRANULARITY", time.Minute),
		"unit TTLs must be multiples of; the protocol's is 1m, lower it only for tests (env CUBICLE_TTL_GRANULARITY)")
	fl.IntVar(&f.execOutputLimit, "exec-output-limit", api.DefaultExecOutputLimit,
		"bytes of each output stream POST /execute returns; the rest is dropped and the result marked truncated (WebSocket exec streams everything)")
	fl.DurationVar(&f.auditRetention, "audit-retention", record.DefaultRetention,
		"how long sandboxes' audit records (events and command output) are kept, also after the sandbox is deleted")
	fl.IntVar(&f.auditOutputCap, "audit-output-cap", record.DefaultOutputCap,
		"bytes of each command output stream the audit record keeps (first and last halves; the middle is dropped and marked)")
	fl.BoolVar(&f.auditFiles, "audit-files", true,
		"record the files each command added, modified and deleted, and the packages it installed, removed or upgraded")
	addAuditExportFlags(fl, &f.auditExport)
	fl.StringVar(&f.defaultImage, "default-image", os.Getenv("CUBICLE_DEFAULT_IMAGE"),
		"where the built-in snapshot \"default\" comes from: \"\" builds the default computer from Debian's packages, an image reference or a file (docker save, OCI or root filesystem tarball) is imported instead, \"none\" provides none (env CUBICLE_DEFAULT_IMAGE)")
	fl.StringVar(&f.blueprintCache, "blueprint-cache", os.Getenv("CUBICLE_BLUEPRINT_CACHE"),
		"directory keeping the default computer's downloaded packages across builds (default <data-dir>/cache/blueprint; env CUBICLE_BLUEPRINT_CACHE)")
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
	log := slog.New(telemetry.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	slog.SetDefault(log)
	tel, err := telemetry.New(ctx)
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tel.Shutdown(ctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}()
	if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	dbPath := filepath.Join(f.dataDir, "cubicle.db")
	st, err := store.OpenSQLite(ctx, dbPath)
	if err != nil {
		return err
	}
	defer st.Close()
	tel.WatchStoreFile(dbPath)
	if err := bootstrapKey(ctx, st, f.dataDir); err != nil {
		return err
	}
	limits, err := f.imageLimits()
	if err != nil {
		return err
	}
	reserve, err := f.storeReserveBytes()
	if err != nil {
		return err
	}
	faults := fault.FromEnv(log)
	images, err := image.NewStore(filepath.Join(f.dataDir, "images"), image.WithInsecureRegistries(f.insecureRegistries),
		image.WithLogger(log), image.WithLimits(limits), image.WithPullMeter(tel), image.WithFaults(faults))
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
	if guard := overlays.Guard(reserve, log); guard != nil {
		go guard.Run(ctx, spaceGuardInterval)
	}
	netmgr, err := network.New(ctx, network.Config{StateDir: filepath.Join(f.dataDir, "network"), Pool: network.DefaultPool()}, network.WithLogger(log))
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
	agentBin := agentBinary(self)
	log.Info("agent binary", "path", agentBin)
	drivers, err := newDrivers(ctx, f, agentBin)
	if err != nil {
		return err
	}
	for _, d := range drivers {
		if dh, ok := d.(runtime.DockerHost); ok {
			log.Info("Docker inside a sandbox on opt-in (docker: true)", "runtime", d.Name(), "grants", dh.DockerInside())
		}
		if vm, ok := d.(*microvm.Driver); ok {
			log.Info("microVM runtime", "accelerator", vm.Accel())
		}
	}
	box, err := secrets.LoadOrCreate(filepath.Join(f.dataDir, "secrets.key"))
	if err != nil {
		return err
	}
	registries := registry.New(st, box)
	// Listening starts here (connections wait in the backlog until the
	// API serves) because the public URL is the identity tokens' issuer,
	// which the egress proxy's callback signatures need.
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	defer ln.Close() // for an early return; Serve closes it too
	// The other listeners are bound now too, before anything binds an
	// ephemeral port (the egress proxy's DNS) that could take theirs.
	var metricsLn, e2bLn net.Listener
	if f.metricsListen != "" {
		if metricsLn, err = net.Listen("tcp", f.metricsListen); err != nil {
			return fmt.Errorf("listen on %s (--metrics-listen): %w", f.metricsListen, err)
		}
		defer metricsLn.Close()
	}
	if f.e2bListen != "" {
		if e2bLn, err = net.Listen("tcp", f.e2bListen); err != nil {
			return fmt.Errorf("listen on %s (--e2b-listen): %w", f.e2bListen, err)
		}
		defer e2bLn.Close()
	}
	public := f.publicURL
	if public == "" {
		public = "http://" + ln.Addr().String()
	}
	keyPath := filepath.Join(f.dataDir, "identity-ed25519.key")
	identityKey, err := jwtkeys.LoadOrCreate(ctx, keyPath, log)
	if err != nil {
		return err
	}
	retired, err := jwtkeys.LoadRetired(keyPath + ".old")
	if err != nil {
		return err
	}
	idSigner, err := jwtkeys.New(identityKey, public, retired...)
	if err != nil {
		return err
	}
	// The record closes (writing what is queued) after the manager, the
	// API and the egress proxy are done recording, before the store
	// closes.
	exporters, err := auditExporters(ctx, f.auditExport, log)
	if err != nil {
		return err
	}
	rec := record.New(st, record.Options{Retention: f.auditRetention, OutputCap: f.auditOutputCap, Exporters: exporters, Logger: log})
	defer rec.Close()
	egress, vault, err := newEgress(ctx, f.egress, f.dataDir, f.hostResolv, netmgr, box, idSigner, tel, rec, log)
	if err != nil {
		return err
	}
	defer egress.Close()
	flowsDone := watchFlows(ctx, netmgr, egress, log)
	defer flowsDone()
	// Data mounts close after the manager (pending write-back is
	// uploaded; running sandboxes are restarted by the next daemon).
	dataMounts, err := newDataMounts(f, vault, netmgr, log)
	if err != nil {
		return err
	}
	defer dataMounts.Close(context.WithoutCancel(ctx))
	buildCache, err := parseSize("--build-cache-size", f.buildCacheBytes)
	if err != nil {
		return err
	}
	blueprints, err := blueprintBuilder(f, log)
	if err != nil {
		return err
	}
	memReserve, err := parseByteSize(f.memReserve)
	if err != nil {
		return fmt.Errorf("--mem-reserve: %w", err)
	}
	capacity := sandbox.HostCapacity{MaxBoots: f.maxBoots, BootQueue: f.bootQueue,
		MemAvailable: sandbox.ReadMemAvailable, MemReserve: memReserve,
		StoreUsable: func() (int64, error) {
			sp, err := cow.Space()
			return sp.Usable, err
		}, StoreReserve: reserve}
	mgr, err := sandbox.New(sandbox.Config{Store: st, Images: images, Storage: overlays, Network: netmgr, Drivers: drivers, AgentBinary: agentBin, Logger: log,
		Credentials: registries, ReapInterval: f.reapInterval, TTLGranularity: f.ttlGranularity, Egress: egress, Mounts: dataMounts, Observer: tel,
		Faults:   faults,
		Recorder: rec, BuildDir: filepath.Join(f.dataDir, "builds"), BuildCacheBytes: buildCache,
		OnDemandBuiltins: onDemandBuiltins(self, blueprints, images, log), Capacity: capacity})
	if err != nil {
		return err
	}
	// The manager's goroutines (reaper, watchers, builds) end before the
	// store closes: this runs before the deferred st.Close.
	defer mgr.Close()
	if f.auditFiles {
		// Queued file scans finish (recording) before the record closes.
		files := filerec.New(rec, mgr, log)
		rec.WatchFiles(files)
		defer files.Close()
	}
	if err := mgr.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	if err := ensureDefault(ctx, f, mgr, blueprints, images); err != nil {
		return err
	}
	if f.poolDefault >= 0 {
		if err := mgr.SetDefaultPool(ctx, f.poolDefault); err != nil {
			return err
		}
	}
	if err := mgr.StartPools(ctx); err != nil {
		return err
	}
	tel.WatchSandboxes(mgr.Census)
	if inUse, err := mgr.LayersInUse(ctx); err != nil {
		return err
	} else if _, err := images.GC(ctx, inUse); err != nil {
		log.Warn("image gc at start", "err", err)
	}
	authn := auth.New(st)
	gw, err := newGateway(ctx, f, public, mgr, authn, st, idSigner, log)
	if err != nil {
		return err
	}
	if gw != nil {
		mgr.OnReauthorize(gw.Reauthorize) // a revoked share ends login sessions too
	}
	// The access audit is flushed after the API stops (this defer runs
	// before st.Close); a kill -9 loses at most its last flush interval.
	access := accesslog.New(st, log)
	defer access.Close()
	ident := identity.New(st, authn, access)
	ident.CutSessionsWith(mgr.CutPrincipals) // a revoked key's open streams end at once
	checks := healthChecks(reserve, st, cow, drivers, egress)
	tel.WatchHealth(checks, cow.Space)
	// The MCP door's tools call this same API back, in process, with the
	// caller's key (internal/mcp.Loopback says why not over TCP).
	loop := cubiclemcp.NewLoopback()
	mcpDoor := cubiclemcp.NewHTTPHandler(func(key string) *cubicle.Client {
		return cubicle.New(public, key, cubicle.WithHTTPClient(loop.Client()), cubicle.WithDoor(protocol.DoorMCP))
	}, log.With("component", "mcp"))
	handler := api.New(mgr, authn, images, public, log, api.WithGateway(gw), api.WithJWKS(idSigner), api.WithExecOutputLimit(f.execOutputLimit),
		api.WithIdentity(ident), api.WithAccessLog(access), api.WithTelemetry(tel),
		api.WithRateLimit(f.rateLimit), api.WithRecorder(rec), api.WithHealth(checks, cow.Space), api.WithMCP(mcpDoor))
	handler.EnableRegistries(registries)
	handler.EnableQuotas(mgr, accesslog.Quotas{Recorder: access})
	handler.EnableVolumes(mgr)
	handler.EnablePools(mgr)
	handler.EnableEgress(vault, egress)
	// No RLIMIT_NOFILE code here: the Go runtime already raises the soft
	// limit to the hard one (less one) at start and restores the original
	// for the children it execs (runsc, sandboxes); e2e TestConnLimits
	// checks it. The per-client cap is what bounds one caller's share.
	srv := api.NewHTTPServer(handler, f.conns, log)
	srv.RegisterOnShutdown(rec.EndFollowers) // live audit streams would hold Shutdown
	srv.RegisterOnShutdown(mcpDoor.Close)    // so would MCP sessions' event streams
	mgr.StartReaper(ctx)
	log.Info("cubicle serving", "listen", ln.Addr().String(), "public_url", public, "runtime", f.runtime, "data_dir", f.dataDir,
		"max_conns_per_client", f.conns.MaxConnsPerClient)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(api.LimitListener(ln, f.conns.MaxConnsPerClient, log)) }()
	go func() { _ = srv.Serve(loop) }() // ends with srv's Shutdown
	if metricsLn != nil {
		defer serveMetrics(metricsLn, tel, f.conns, log, errc).Close()
	}
	if e2bLn != nil {
		defer serveE2B(e2bLn, f, public, loop.Client(), log, errc).Close()
	}
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

// serveMetrics serves tel's metrics, unauthenticated, at GET /metrics on
// ln (--metrics-listen); Serve's error goes to errc.
func serveMetrics(ln net.Listener, tel *telemetry.Telemetry, conns api.ConnLimits, log *slog.Logger, errc chan<- error) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", tel.MetricsHandler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: conns.HeaderTimeout, IdleTimeout: conns.IdleTimeout}
	log.Info("serving metrics", "listen", ln.Addr().String())
	go func() { errc <- srv.Serve(ln) }()
	return srv
}

// serveE2B serves the E2B door on ln (--e2b-listen). The door calls the
// API at public with each caller's key, in process through loop (as the
// MCP door does; internal/mcp.Loopback says why not over TCP).
func serveE2B(ln net.Listener, f serveFlags, public string, loop *http.Client, log *slog.Logger, errc chan<- error) *http.Server {
	door := e2b.New(e2b.Config{Endpoint: public, HTTPClient: loop, TTLGranularity: f.ttlGranularity, Logger: log})
	// No write timeout: command and watch streams are long-lived.
	srv := &http.Server{Handler: door, ReadHeaderTimeout: f.conns.HeaderTimeout, IdleTimeout: f.conns.IdleTimeout}
	log.Info("serving the E2B API", "listen", ln.Addr().String())
	go func() { errc <- srv.Serve(api.LimitListener(ln, f.conns.MaxConnsPerClient, log)) }()
	return srv
}

// newDrivers makes the drivers --runtime names, in its order (the first
// the default), each with its own state dir.
func newDrivers(ctx context.Context, f serveFlags, agentBin string) ([]runtime.Driver, error) {
	var out []runtime.Driver
	for _, name := range strings.Split(f.runtime, ",") {
		name = strings.TrimSpace(name)
		if slices.ContainsFunc(out, func(d runtime.Driver) bool { return d.Name() == name }) {
			return nil, fmt.Errorf("--runtime %q names %s twice", f.runtime, name)
		}
		d, err := newDriver(ctx, f, name, agentBin)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func newDriver(ctx context.Context, f serveFlags, name, agentBin string) (runtime.Driver, error) {
	stateDir := filepath.Join(f.dataDir, "runtime", name)
	switch name {
	case "gvisor":
		runsc, err := gvisor.FindRunsc(f.runsc)
		if err != nil {
			return nil, err
		}
		return gvisor.New(runsc, stateDir, gvisor.WithHostResolvConf(f.hostResolv))
	case "namespace":
		return namespace.New(stateDir, namespace.WithHostResolvConf(f.hostResolv))
	case microvm.Name:
		kernel, err := microvm.FindKernel(f.guestKernel)
		if err != nil {
			return nil, err
		}
		return microvm.New(ctx, microvm.Config{QEMU: f.qemu, Kernel: kernel, StateDir: stateDir,
			HostResolvConf: f.hostResolv, Accel: f.microvmAccel, Agent: agentBin})
	default:
		return nil, fmt.Errorf("unknown --runtime %q (want gvisor, namespace or microvm, or a comma list of them)", name)
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

// blueprintBuilder is the builder of every built-in blueprint (the
// default computer, the on-demand docker one), its work dir emptied of
// builds a crash interrupted.
func blueprintBuilder(f serveFlags, log *slog.Logger) (*blueprint.Builder, error) {
	work := filepath.Join(f.dataDir, "blueprint")
	if err := os.RemoveAll(work); err != nil {
		return nil, fmt.Errorf("clear blueprint work dir: %w", err)
	}
	cache := f.blueprintCache
	if cache == "" {
		cache = filepath.Join(f.dataDir, "cache", "blueprint")
	}
	return &blueprint.Builder{WorkDir: work, CacheDir: cache, Log: log}, nil
}

// onDemandBuiltins are the built-in snapshots made at their first use:
// docker, and builder (see sandbox.BuilderSnapshot) when buildkitd and
// buildctl ship next to the cubicle binary self (make build puts them in
// bin/).
func onDemandBuiltins(self string, blueprints *blueprint.Builder, images *image.Store, log *slog.Logger) map[string]sandbox.BuiltinSource {
	out := map[string]sandbox.BuiltinSource{"docker": &blueprint.Source{Builder: blueprints, Recipe: blueprint.Docker(), Images: images}}
	var bins [2]blueprint.Binary
	for i, name := range []string{"buildkitd", "buildctl"} {
		var err error
		if bins[i], err = blueprint.NewBinary(filepath.Join(filepath.Dir(self), name)); err != nil {
			log.Info("no builder snapshot for the official clients' createSnapshotFromDockerfile: BuildKit does not ship beside cubicle", "err", err)
			return out
		}
	}
	out[sandbox.BuilderSnapshot] = &blueprint.Source{Builder: blueprints, Recipe: blueprint.DockerfileBuilder(bins[0], bins[1]), Images: images}
	return out
}

// ensureDefault makes sure the built-in snapshot "default" is ready or
// being made, as --default-image says (see internal/blueprint).
func ensureDefault(ctx context.Context, f serveFlags, mgr *sandbox.Manager, blueprints *blueprint.Builder, images *image.Store) error {
	var src sandbox.BuiltinSource
	switch f.defaultImage {
	case "none":
		return nil
	case "":
		src = &blueprint.Source{Builder: blueprints, Recipe: blueprint.Default(), Images: images}
	default:
		src = &blueprint.Imported{Name: "default", Spec: f.defaultImage, Images: images}
	}
	return mgr.EnsureBuiltin(ctx, "default", src)
}

// agentBinary is the binary sandboxes run as PID 1, given the daemon's own
// (self): cubicle-agent beside it, which starts sooner inside a sandbox
// (see cmd/cubicle-agent), when it is there; else self, which has the
// same roles.
func agentBinary(self string) string {
	small := filepath.Join(filepath.Dir(self), "cubicle-agent")
	if st, err := os.Stat(small); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return small
	}
	return self
}

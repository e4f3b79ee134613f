// Package e2b is Cubicle's E2B-compatible front door: it serves the
// control plane the e2b SDKs call (sandboxes, timeouts, pause and resume,
// templates) and the in-sandbox envd API they talk to (Connect-RPC
// process.Process and filesystem.Filesystem, /files, /health), and
// translates both into calls on Cubicle's own HTTP API through the Go SDK.
//
// The door holds no authority of its own: every call it makes carries the
// caller's API key (an E2B API key is a Cubicle API key) and names the door
// in protocol.DoorHeader, so authorization, tenancy, limits and the audit record
// are the LangSmith API's. envd traffic is routed by the E2b-Sandbox-Id
// header (the SDK sends all of it to E2B_SANDBOX_URL when set), so one
// listener serves both planes and no wildcard DNS is needed.
//
// Mapping: an E2B sandbox id is the Cubicle sandbox's name; templates are
// snapshots; timeout is the idle TTL (a sandbox that times out is stopped
// and then deleted, or only stopped with its memory kept when it was
// created with autoPause); pause and resume are a memory-preserving stop
// and a start that restores memory; metadata is labels.
package e2b

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/e2b/envd/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/internal/e2b/envd/process/processconnect"
	cubicle "github.com/cubicle-dev/cubicle/sdk/go"
	"github.com/cubicle-dev/cubicle/sdk/go/protocol"
)

// EnvdVersion is the envd version the door reports. The SDKs gate
// features on it: 0.4.0 lets the sandbox's own user be the default, 0.5.2
// enables closeStdin, 0.5.7 octet-stream uploads. Features of later
// versions (file metadata, entries in watch events) are refused by the SDK
// itself.
const EnvdVersion = "0.5.7"

// Config configures a Door.
type Config struct {
	// Endpoint is the Cubicle API the door calls (the daemon's public
	// URL, reached through HTTPClient).
	Endpoint string
	// TTLGranularity is the unit the daemon's TTLs must be multiples of
	// (cubicle serve --ttl-granularity); E2B timeouts are rounded up to it.
	TTLGranularity time.Duration
	// HTTPClient carries the door's calls (default http.DefaultClient).
	HTTPClient *http.Client
	// Logger reports processes that failed after they started (default:
	// discard).
	Logger *slog.Logger
}

// Door is the E2B front door. Its only state is the table of processes
// started through it, which outlive the RPC that started them (background
// commands, reconnects) and end with the command.
type Door struct {
	cfg   Config
	procs *procTable
	mux   *http.ServeMux
	// pollEvery is how often WatchDir looks for changes.
	pollEvery time.Duration
}

// maxRPCMessage bounds one envd request message (stdin chunks are the
// big ones; the SDKs send them as they come).
const maxRPCMessage = 16 << 20

// New returns a Door for cfg.
func New(cfg Config) *Door {
	if cfg.TTLGranularity <= 0 {
		cfg.TTLGranularity = time.Minute
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = http.DefaultClient
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Door{cfg: cfg, procs: newProcTable(), mux: http.NewServeMux(), pollEvery: 300 * time.Millisecond}
	d.routeControlPlane()
	limit := connect.WithReadMaxBytes(maxRPCMessage)
	d.mux.Handle(processconnect.NewProcessHandler(&processService{d: d}, limit))
	d.mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{d: d}, limit))
	d.mux.HandleFunc("GET /files", d.download)
	d.mux.HandleFunc("POST /files", d.upload)
	d.mux.HandleFunc("GET /health", d.health)
	return d
}

// ServeHTTP implements http.Handler.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) { d.mux.ServeHTTP(w, r) }

// client returns a Cubicle client acting with key, naming the door.
func (d *Door) client(key string) *cubicle.Client {
	return cubicle.New(d.cfg.Endpoint, key, cubicle.WithHTTPClient(d.cfg.HTTPClient), cubicle.WithDoor(protocol.DoorE2B))
}

// controlKey is the API key of a control-plane request (X-API-Key).
func controlKey(h http.Header) string { return h.Get("X-Api-Key") }

// envdKey is the API key of an envd request: the envdAccessToken the
// control plane handed out (the caller's own key) comes back as
// X-Access-Token; X-API-Key works too, for hand-made requests.
func envdKey(h http.Header) string {
	if k := h.Get("X-Access-Token"); k != "" {
		return k
	}
	return controlKey(h)
}

// errNoSandbox is an envd request without E2b-Sandbox-Id.
var errNoSandbox = errors.New("missing E2b-Sandbox-Id header: point E2B_SANDBOX_URL at the door")

// sandboxTarget is the sandbox an envd request addresses, as its caller
// sees it.
type sandboxTarget struct {
	c    *cubicle.Client
	key  string
	name string
	id   string // Cubicle's id, which keys the process table
	user string // the sandbox's run_config user
}

// target resolves the sandbox an envd request addresses with its caller's
// key: a sandbox the key cannot see is not found, one that is not running
// is unavailable (the SDKs read that as "timed out or killed").
func (d *Door) target(ctx context.Context, h http.Header) (*sandboxTarget, error) {
	name := h.Get("E2b-Sandbox-Id")
	if name == "" {
		return nil, errNoSandbox
	}
	key := envdKey(h)
	c := d.client(key)
	sb, err := c.GetSandbox(ctx, name)
	if cubicle.IsNotFound(err) {
		// A killed or unknown sandbox: E2B's proxy answers 502.
		return nil, &notRunningError{name: name, status: "not found"}
	}
	if err != nil {
		return nil, err
	}
	if sb.Status != protocol.StatusReady {
		return nil, &notRunningError{name: name, status: sb.Status}
	}
	t := &sandboxTarget{c: c, key: key, name: name, id: sb.ID}
	if sb.RunConfig != nil {
		t.user = sb.RunConfig.User
	}
	return t, nil
}

// notRunningError is an envd request for a sandbox that is not running.
type notRunningError struct{ name, status string }

func (e *notRunningError) Error() string {
	return "sandbox " + e.name + " is not running (" + e.status + ")"
}

// procTable holds the processes started through the door, by sandbox id
// and pid. A process is in it from its start until its end event.
type procTable struct {
	mu    sync.Mutex
	boxes map[string]map[uint32]*proc
	next  uint32 // fallback pids when the server names none
}

func newProcTable() *procTable {
	return &procTable{boxes: map[string]map[uint32]*proc{}, next: 1 << 20}
}

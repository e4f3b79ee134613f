// Package sandboxtest provides in-memory fakes of the sandbox manager's
// seams — Storage, Network, a runtime.Driver and the agent it starts — so
// the manager's lifecycle, reaper, recovery, capture/fork bookkeeping and
// authorization run in unit tests without root. The fake agent is a real
// HTTP server on a loopback address speaking the agent's API (health,
// activity, token rotation), so the manager uses its real agent client.
package sandboxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/cubicle-dev/cubicle/internal/agent"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Storage fakes the manager's Storage with plain directories under Root.
type Storage struct {
	Root string

	mu      sync.Mutex
	mounted map[string]bool
	limits  map[string]int64
	// MountErr, when set, fails every Mount.
	MountErr error
	// VolumeErr, when set, fails every CreateVolume.
	VolumeErr error
}

// NewStorage returns a Storage under root.
func NewStorage(root string) *Storage {
	return &Storage{Root: root, mounted: map[string]bool{}, limits: map[string]int64{}}
}

// Backend implements sandbox.Storage.
func (s *Storage) Backend() string { return "fake" }

// UpperDir implements sandbox.Storage.
func (s *Storage) UpperDir(id string) string { return filepath.Join(s.Root, "sandboxes", id, "upper") }

// Prepare implements sandbox.Storage.
func (s *Storage) Prepare(_ context.Context, id string) (string, error) {
	return s.UpperDir(id), os.MkdirAll(s.UpperDir(id), 0o755)
}

// Mount implements sandbox.Storage: the rootfs is the upper dir itself.
func (s *Storage) Mount(ctx context.Context, id string, _ []string) (string, error) {
	if s.MountErr != nil {
		return "", s.MountErr
	}
	up, err := s.Prepare(ctx, id)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.mounted[id] = true
	s.mu.Unlock()
	return up, nil
}

// Unmount implements sandbox.Storage.
func (s *Storage) Unmount(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mounted, id)
	return nil
}

// Mounted reports whether id's rootfs is mounted.
func (s *Storage) Mounted(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mounted[id]
}

// Remove implements sandbox.Storage.
func (s *Storage) Remove(ctx context.Context, id string) error {
	s.Unmount(ctx, id)
	return os.RemoveAll(filepath.Join(s.Root, "sandboxes", id))
}

// List implements sandbox.Storage.
func (s *Storage) List(context.Context) ([]string, error) { return s.names("sandboxes") }

// Quarantine implements sandbox.Storage: id's data moves to Root/orphans/id.
func (s *Storage) Quarantine(ctx context.Context, id string) (string, error) {
	s.Unmount(ctx, id)
	return s.moveAside("sandboxes", id)
}

// ListCaptures implements sandbox.Storage.
func (s *Storage) ListCaptures(context.Context) ([]string, error) { return s.names("captures") }

// QuarantineCapture implements sandbox.Storage: snap's layer moves to
// Root/orphans/snap.
func (s *Storage) QuarantineCapture(_ context.Context, snap string) (string, error) {
	return s.moveAside("captures", snap)
}

// names lists the entries of Root/dir (none if it is missing).
func (s *Storage) names(dir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(s.Root, dir))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// moveAside moves Root/dir/id to Root/orphans/id.
func (s *Storage) moveAside(dir, id string) (string, error) {
	dst := filepath.Join(s.Root, "orphans", id)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	return dst, os.Rename(filepath.Join(s.Root, dir, id), dst)
}

// Exists reports whether id has any data left.
func (s *Storage) Exists(id string) bool {
	_, err := os.Stat(filepath.Join(s.Root, "sandboxes", id))
	return err == nil
}

// Reset implements sandbox.Storage.
func (s *Storage) Reset(_ context.Context, id string) error {
	if err := os.RemoveAll(s.UpperDir(id)); err != nil {
		return err
	}
	return os.MkdirAll(s.UpperDir(id), 0o755)
}

// Limit implements sandbox.Storage; it records the limit and enforces nothing.
func (s *Storage) Limit(_ context.Context, id string, bytes int64) (bool, error) {
	s.setLimit(id, bytes)
	return false, nil
}

// LimitOf returns the last limit set on id (0: none).
func (s *Storage) LimitOf(id string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limits[id]
}

// Flush implements sandbox.Storage.
func (s *Storage) Flush(context.Context, string) error { return nil }

// CaptureLayer implements sandbox.Storage.
func (s *Storage) CaptureLayer(snap string) string {
	return filepath.Join(s.Root, "captures", snap, "layer")
}

// Capture implements sandbox.Storage by copying the upper dir.
func (s *Storage) Capture(_ context.Context, id, snap string) (string, error) {
	dst := s.CaptureLayer(snap)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	if err := os.CopyFS(dst, os.DirFS(s.UpperDir(id))); err != nil {
		return "", fmt.Errorf("fake capture: %w", err)
	}
	return dst, nil
}

// MemoryDir implements sandbox.Storage.
func (s *Storage) MemoryDir(snap string) string {
	return filepath.Join(s.Root, "captures", snap, "memory")
}

// RemoveCapture implements sandbox.Storage.
func (s *Storage) RemoveCapture(_ context.Context, snap string) error {
	return os.RemoveAll(filepath.Join(s.Root, "captures", snap))
}

// Usage implements sandbox.Storage: one byte per id, for bookkeeping tests.
func (s *Storage) Usage(_ context.Context, ids, snaps []string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, id := range append(append([]string(nil), ids...), snaps...) {
		out[id] = 1
	}
	return out, nil
}

// Network fakes the manager's Network: each id gets its own loopback
// address (127.77.x.y), which the fake Driver's agent listens on.
type Network struct {
	mu   sync.Mutex
	next int
	eps  map[string]*network.Endpoint
	// SetupErr, when set, fails every Setup.
	SetupErr error
}

// NewNetwork returns an empty Network.
func NewNetwork() *Network { return &Network{eps: map[string]*network.Endpoint{}} }

const netnsPrefix = "fake-netns:"

// Setup implements sandbox.Network.
func (n *Network) Setup(_ context.Context, id string) (*network.Endpoint, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.SetupErr != nil {
		return nil, n.SetupErr
	}
	if ep := n.eps[id]; ep != nil {
		return ep, nil
	}
	n.next++
	ip := netip.AddrFrom4([4]byte{127, 77, byte(n.next / 250), byte(n.next%250 + 1)})
	ep := &network.Endpoint{ID: id, NetNS: netnsPrefix + ip.String(), SandboxIP: ip, HostIP: ip, PrefixLen: 32}
	n.eps[id] = ep
	return ep, nil
}

// Lookup implements sandbox.Network.
func (n *Network) Lookup(_ context.Context, id string) (*network.Endpoint, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ep := n.eps[id]; ep != nil {
		return ep, nil
	}
	return nil, fmt.Errorf("fake network: no endpoint %s", id)
}

// Teardown implements sandbox.Network.
func (n *Network) Teardown(_ context.Context, id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.eps, id)
	return nil
}

// List implements sandbox.Network.
func (n *Network) List(context.Context) ([]string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]string, 0, len(n.eps))
	for id := range n.eps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Endpoints counts the endpoints set up.
func (n *Network) Endpoints() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.eps)
}

// Driver fakes runtime.Driver (with Pauser and Checkpointer): Start runs a
// fake agent on the endpoint's address and, so the manager can watch it, a
// sleeping child process whose death is the sandbox's.
type Driver struct {
	// AgentPort is the port every fake agent listens on.
	AgentPort int
	// RuntimeName is what Name returns ("fake" when empty): a second
	// Driver of another name, on the same AgentPort, is a second runtime.
	RuntimeName string
	// StartHook, when set, runs at the start of Start and Restore; an
	// error fails the start.
	StartHook func(ctx context.Context, spec runtime.Spec) error
	// CheckpointErr, when set, fails every Checkpoint (after pausing, as
	// a real one may).
	CheckpointErr error
	// RestoreErr, when set, fails every Restore.
	RestoreErr error
	// IdentityErr, when set, fails every SetIdentity.
	IdentityErr error
	// PIDHook, when set, runs at the start of every PID.
	PIDHook func(id string)

	mu     sync.Mutex
	boxes  map[string]*instance
	paused map[string]bool
	killed map[string]bool
}

type instance struct {
	spec      runtime.Spec
	machineID string
	srv       *http.Server
	proc      *exec.Cmd
	agent     *Agent
	restored  bool
}

// NewDriver returns a Driver whose agents listen on a free port.
func NewDriver() (*Driver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return &Driver{AgentPort: port, boxes: map[string]*instance{}, paused: map[string]bool{}, killed: map[string]bool{}}, nil
}

// Name implements runtime.Driver.
func (d *Driver) Name() string {
	if d.RuntimeName != "" {
		return d.RuntimeName
	}
	return "fake"
}

var _ runtime.DockerHost = (*Driver)(nil)

// DockerInside implements runtime.DockerHost: the fake records
// Spec.Docker (see Spec) and grants nothing.
func (d *Driver) DockerInside() string { return "nothing (fake)" }

// Start implements runtime.Driver.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) error {
	return d.start(ctx, spec, spec.Token, false)
}

func (d *Driver) start(ctx context.Context, spec runtime.Spec, token string, restored bool) error {
	if d.StartHook != nil {
		if err := d.StartHook(ctx, spec); err != nil {
			return err
		}
	}
	ip, ok := strings.CutPrefix(spec.NetNS, netnsPrefix)
	if !ok {
		return fmt.Errorf("fake driver: netns %q is not a fake one", spec.NetNS)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(d.AgentPort)))
	if err != nil {
		return fmt.Errorf("fake driver: %w", err)
	}
	proc := exec.Command("sleep", "3600")
	// It dies with the test binary: a test that ends with sandboxes up must
	// leave no process behind.
	proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := proc.Start(); err != nil {
		l.Close()
		return fmt.Errorf("fake driver: %w", err)
	}
	go proc.Wait()
	a := NewAgent(token)
	srv := &http.Server{Handler: a}
	go srv.Serve(l)
	d.mu.Lock()
	d.boxes[spec.ID] = &instance{spec: spec, srv: srv, proc: proc, agent: a, restored: restored}
	d.mu.Unlock()
	return nil
}

// Stop implements runtime.Driver.
func (d *Driver) Stop(_ context.Context, id string) error {
	d.mu.Lock()
	in := d.boxes[id]
	delete(d.boxes, id)
	delete(d.paused, id)
	delete(d.killed, id)
	d.mu.Unlock()
	if in != nil {
		in.srv.Close()
		in.proc.Process.Kill()
	}
	return nil
}

// Kill makes sandbox id die on its own, as an OOM kill would: its process
// exits and its agent stops answering, but the driver still knows it.
func (d *Driver) Kill(id string) {
	d.mu.Lock()
	in := d.boxes[id]
	d.killed[id] = in != nil
	d.mu.Unlock()
	if in != nil {
		in.srv.Close()
		in.proc.Process.Signal(syscall.SIGKILL)
	}
}

// ExitCause implements runtime.Explainer: it names Kill.
func (d *Driver) ExitCause(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.killed[id] {
		return "killed by the test"
	}
	return ""
}

// Running implements runtime.Driver.
func (d *Driver) Running(_ context.Context, id string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.boxes[id] != nil, nil
}

// List implements runtime.Lister: the ids started and not stopped.
func (d *Driver) List(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]string, 0, len(d.boxes))
	for id := range d.boxes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// PID implements runtime.Driver.
func (d *Driver) PID(_ context.Context, id string) (int, error) {
	if d.PIDHook != nil {
		d.PIDHook(id)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.boxes[id]; in != nil && !d.killed[id] {
		return in.proc.Process.Pid, nil
	}
	return 0, nil
}

// Spec returns the spec sandbox id was started with.
func (d *Driver) Spec(id string) (runtime.Spec, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.boxes[id]; in != nil {
		return in.spec, true
	}
	return runtime.Spec{}, false
}

// Agent returns the fake agent of running sandbox id, or nil.
func (d *Driver) Agent(id string) *Agent {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.boxes[id]; in != nil {
		return in.agent
	}
	return nil
}

// Restored reports whether running sandbox id was restored from a memory
// image rather than started.
func (d *Driver) Restored(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.boxes[id]
	return in != nil && in.restored
}

// Instances counts the instances running.
func (d *Driver) Instances() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.boxes)
}

// Pause implements runtime.Pauser.
func (d *Driver) Pause(_ context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.boxes[id] == nil {
		return fmt.Errorf("fake driver: %s not running", id)
	}
	d.paused[id] = true
	return nil
}

// Resume implements runtime.Pauser.
func (d *Driver) Resume(_ context.Context, id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.paused, id)
	return nil
}

// Paused reports whether id is paused.
func (d *Driver) Paused(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.paused[id]
}

const imageToken = "fake-image-token"

// Checkpoint implements runtime.Checkpointer: the "image" is the agent's
// current token, which a restored agent holds again.
func (d *Driver) Checkpoint(_ context.Context, id, dir string) error {
	d.mu.Lock()
	in := d.boxes[id]
	if in != nil {
		d.paused[id] = true
	}
	d.mu.Unlock()
	if in == nil {
		return fmt.Errorf("fake driver: %s not running", id)
	}
	if d.CheckpointErr != nil {
		return d.CheckpointErr
	}
	return os.WriteFile(filepath.Join(dir, imageToken), []byte(in.agent.Token()), 0o600)
}

// Suspend implements runtime.Checkpointer as Checkpoint does: the fake's
// Stop ends the instance either way.
func (d *Driver) Suspend(ctx context.Context, id, dir string) error {
	return d.Checkpoint(ctx, id, dir)
}

// Restore implements runtime.Checkpointer.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, dir string) error {
	if d.RestoreErr != nil {
		return d.RestoreErr
	}
	tok, err := os.ReadFile(filepath.Join(dir, imageToken))
	if err != nil {
		return fmt.Errorf("fake restore: %w", err)
	}
	return d.start(ctx, spec, string(tok), true)
}

// SetIdentity implements runtime.Identifier: the instance's spec takes
// hostname, and machineID is recorded (Identity reports both).
func (d *Driver) SetIdentity(_ context.Context, id, hostname, machineID string) error {
	if d.IdentityErr != nil {
		return d.IdentityErr
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.boxes[id]
	if in == nil {
		return fmt.Errorf("fake driver: %s is not running", id)
	}
	in.spec.Hostname, in.machineID = hostname, machineID
	return nil
}

// SetBackground implements runtime.CPUWeighter: the instance's spec
// takes the share (Limits.Background).
func (d *Driver) SetBackground(_ context.Context, id string, background bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.boxes[id]
	if in == nil {
		return fmt.Errorf("fake driver: %s is not running", id)
	}
	in.spec.Limits.Background = background
	return nil
}

// Background reports whether instance id runs at the background CPU
// share (as booted, or as SetBackground last set it).
func (d *Driver) Background(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := d.boxes[id]
	return in != nil && in.spec.Limits.Background
}

// Identity is instance id's hostname and the machine-id SetIdentity gave
// it ("" before).
func (d *Driver) Identity(id string) (hostname, machineID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if in := d.boxes[id]; in != nil {
		return in.spec.Hostname, in.machineID
	}
	return "", ""
}

// Agent is a fake agent: it answers the agent API's health, activity and
// token calls for one token.
type Agent struct {
	mu       sync.Mutex
	token    string
	activity agent.Activity
	polls    int
}

// NewAgent returns an Agent accepting token.
func NewAgent(token string) *Agent { return &Agent{token: token} }

// Token is the token the agent accepts now.
func (a *Agent) Token() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.token
}

// SetActivity sets what GET /v1/activity answers.
func (a *Agent) SetActivity(act agent.Activity) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.activity = act
}

// ActivityPolls counts the GET /v1/activity calls answered.
func (a *Agent) ActivityPolls() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.polls
}

// ServeHTTP implements the agent API subset.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	ok := r.Header.Get("Authorization") == "Bearer "+a.token
	act := a.activity
	if ok && r.URL.Path == "/v1/activity" {
		a.polls++
	}
	a.mu.Unlock()
	if !ok {
		http.Error(w, `{"detail":{"error":"Unauthorized","message":"bad token"}}`, http.StatusUnauthorized)
		return
	}
	switch r.URL.Path {
	case "/v1/health":
		json.NewEncoder(w).Encode(map[string]any{"ok": true, "protocol": agent.ProtocolVersion})
	case "/v1/activity":
		json.NewEncoder(w).Encode(act)
	case "/v1/token":
		var req agent.RotateTokenRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Token == "" {
			http.Error(w, "bad token", http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		a.token = req.Token
		a.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

// What the fake Driver and Network report for every running instance.
const (
	FakeCPUSeconds  = 1.5
	FakeMemoryBytes = 64 << 20
	FakeRxBytes     = 1000
	FakeTxBytes     = 200
)

// Usage implements runtime.Meter: the Fake values for a running instance.
func (d *Driver) Usage(_ context.Context, id string) (runtime.Usage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.boxes[id] == nil {
		return runtime.Usage{}, fmt.Errorf("fake driver: %s is not running", id)
	}
	return runtime.Usage{CPU: FakeCPUSeconds * 1e9, MemoryBytes: FakeMemoryBytes}, nil
}

// Counters counts FakeRxBytes and FakeTxBytes for an endpoint that is set up.
func (n *Network) Counters(id string) (network.Counters, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.eps[id] == nil {
		return network.Counters{}, fmt.Errorf("fake network: no endpoint %s", id)
	}
	return network.Counters{RxBytes: FakeRxBytes, TxBytes: FakeTxBytes}, nil
}

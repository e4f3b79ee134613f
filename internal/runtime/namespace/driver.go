// Package namespace is Cubicle's fast runtime driver for trusted work: the
// agent runs as PID 1 under plain Linux isolation built straight from Go —
// user, mount, pid, uts, ipc and cgroup namespaces, the manager's network
// namespace, pivot_root into an idmapped rootfs, a reduced capability set,
// no_new_privs, a seccomp allow list and cgroup v1 limits.
//
// The host kernel is shared, so this is not a boundary for hostile code; it
// starts in milliseconds and is what tests above the driver use.
//
// Start re-executes an init binary (by default /proc/self/exe with argument
// InitArg; the daemon's hidden `cubicle nsinit` command calls Init) that
// prepares the sandbox from inside and then execs the agent. Sandboxes are
// detached: they survive the daemon, and the pid plus its kernel start time
// persisted under stateDir/<id>/ let a restarted daemon find them again
// without being fooled by pid reuse.
//
// Memory: the sandbox's memory cgroup caps everything in it, and the kernel's
// OOM killer picks the task with the largest footprint — the hog, not the
// small agent. The agent is deliberately not given oom_score_adj -1000: the
// value is inherited across fork and Go's os/exec cannot reset it in the
// child before exec, so every command would become unkillable too and an
// OOM in the cgroup would find no victim.
package namespace

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/atomicfile"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

var _ runtime.Driver = (*Driver)(nil)

// Driver runs sandboxes in Linux namespaces. It is safe for concurrent use on
// different ids. All durable state lives in stateDir/<id>/ and in the cgroup
// directories (including each sandbox's owner uid, see allocOwner); the
// Driver value holds only configuration and a cached user namespace fd for
// idmapping.
type Driver struct {
	stateDir     string
	initPath     string
	cgroupRoot   string
	cgroupParent string
	resolvConf   string

	usernsOnce sync.Mutex
	usernsFD   int // -1 until first Start

	ownersMu sync.Mutex // serialises allocOwner

	agentMu sync.Mutex
	agent   agentFS
}

// Option configures a Driver.
type Option func(*Driver)

// WithInitBinary sets the binary re-executed as the sandbox's init (it must
// call Init when its first argument is InitArg). Default: /proc/self/exe.
func WithInitBinary(path string) Option { return func(d *Driver) { d.initPath = path } }

// WithCgroupRoot sets where the cgroup v1 hierarchies are mounted (default
// /sys/fs/cgroup) and the parent directory used inside each (default
// "cubicle").
func WithCgroupRoot(root, parent string) Option {
	return func(d *Driver) { d.cgroupRoot, d.cgroupParent = root, parent }
}

// WithHostResolvConf sets the resolv.conf whose non-loopback nameservers are
// copied into sandboxes (default /etc/resolv.conf).
func WithHostResolvConf(path string) Option { return func(d *Driver) { d.resolvConf = path } }

// New returns a driver keeping its state under stateDir.
func New(stateDir string, opts ...Option) (*Driver, error) {
	d := &Driver{
		stateDir:     stateDir,
		initPath:     "/proc/self/exe",
		cgroupRoot:   "/sys/fs/cgroup",
		cgroupParent: "cubicle",
		resolvConf:   "/etc/resolv.conf",
		usernsFD:     -1,
		agent:        agentFS{fd: -1},
	}
	for _, o := range opts {
		o(d)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("namespace driver state dir: %w", err)
	}
	return d, nil
}

// Name implements runtime.Driver.
func (d *Driver) Name() string { return "namespace" }

// Close releases the cached user namespace fd and agent copy. Sandboxes
// keep running.
func (d *Driver) Close() error {
	d.usernsOnce.Lock()
	defer d.usernsOnce.Unlock()
	if d.usernsFD >= 0 {
		unix.Close(d.usernsFD)
		d.usernsFD = -1
	}
	d.agentMu.Lock()
	defer d.agentMu.Unlock()
	if d.agent.fd >= 0 {
		unix.Close(d.agent.fd)
		d.agent = agentFS{fd: -1}
	}
	return nil
}

// userns returns the cached idmapping namespace, creating it on first use.
func (d *Driver) userns() (int, error) {
	d.usernsOnce.Lock()
	defer d.usernsOnce.Unlock()
	if d.usernsFD >= 0 {
		return d.usernsFD, nil
	}
	fd, err := userns.New([]string{d.initPath, InitArg}, userns.HostIDBase)
	if err != nil {
		return -1, err
	}
	d.usernsFD = fd
	return fd, nil
}

var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}$`)

func validID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("sandbox id %q: %w", id, errdefs.ErrInvalid)
	}
	return nil
}

func (d *Driver) dir(id string) string { return filepath.Join(d.stateDir, id) }

// state is persisted in stateDir/<id>/state.json once PID 1 has exec'd the
// agent.
type state = runtime.Process

func (d *Driver) readState(id string) (state, error) {
	var st state
	b, err := os.ReadFile(filepath.Join(d.dir(id), "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return st, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse state of %s: %w", id, err)
	}
	return st, nil
}

func (d *Driver) writeState(id string, st state) error {
	b, _ := json.Marshal(st)
	if err := atomicfile.WriteFile(filepath.Join(d.dir(id), "state.json"), b, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

// Running implements runtime.Driver.
func (d *Driver) Running(ctx context.Context, id string) (bool, error) {
	if err := validID(id); err != nil {
		return false, err
	}
	st, err := d.readState(id)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return st.Alive(), nil
}

// PID implements runtime.Driver: the sandbox's PID 1 as seen from the host
// while it is alive, else 0.
func (d *Driver) PID(ctx context.Context, id string) (int, error) {
	if err := validID(id); err != nil {
		return 0, err
	}
	st, err := d.readState(id)
	if errdefs.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !st.Alive() {
		return 0, nil
	}
	return st.PID, nil
}

// Stop implements runtime.Driver. It kills PID 1 (the kernel then kills every
// other process of the pid namespace), waits until it is gone, kills any
// straggler left in the cgroups, and removes cgroups and state. It is
// idempotent.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	st, err := d.readState(id)
	if err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if err == nil {
		if err := st.Kill(ctx); err != nil {
			return fmt.Errorf("stop sandbox %s: %w", id, err)
		}
	}
	if err := d.cgroupsFor(id).remove(ctx); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	if err := os.RemoveAll(d.dir(id)); err != nil {
		return fmt.Errorf("stop sandbox %s: remove state: %w", id, err)
	}
	return nil
}

var _ runtime.Lister = (*Driver)(nil)

// List implements runtime.Lister: the ids with a state dir.
func (d *Driver) List(context.Context) ([]string, error) {
	return runtime.ListStateDirs(d.stateDir, idPattern)
}

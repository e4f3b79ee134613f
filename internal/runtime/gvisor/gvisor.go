// Package gvisor is the default runtime driver: each sandbox runs under
// gVisor's user-space kernel (the Sentry), started by an external runsc
// binary, so the host kernel sees only the Sentry's small syscall surface.
//
// Layout: every sandbox owns stateDir/<id>/ (its OCI bundle: config.json,
// runsc.log and console.log), and runsc
// keeps its own container state under stateDir/runsc, shared by all ids.
// That directory is all the driver persists, which is what lets a new Driver
// (after a daemon restart) see and stop sandboxes an older one started.
//
// Invariants: stateDir/<id>/ exists exactly while runsc may hold state for
// id; Start leaves neither behind on failure, and Stop removes both.
//
// Writes inside a sandbox land in the host-visible upper directory of the
// overlay the manager mounted at Spec.RootFS, because the driver runs runsc
// with --overlay2=none rather than gVisor's default in-sandbox file store.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Name is the driver's --runtime identifier.
const Name = "gvisor"

// Compile-time check that Driver implements runtime.Driver.
var _ runtime.Driver = (*Driver)(nil)

// idPattern is the only id shape accepted: runsc matches container ids by
// prefix, which is safe only when every id has the same length.
var idPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// Driver runs sandboxes under gVisor. It holds no per-sandbox memory: all
// state lives in stateDir (see the package doc), so methods are safe for
// concurrent use on different ids and any number of Drivers may share one
// stateDir over time.
type Driver struct {
	runsc      string
	stateDir   string
	platform   string
	overlay    string
	fileAccess string
	debugDir   string
	hostResolv string
	extraFlags []string
	// runscTimeout bounds the short runsc subcommands (see deadline).
	runscTimeout time.Duration
}

// Option configures a Driver.
type Option func(*Driver)

// WithDebugLog turns on runsc's --debug and writes its logs (runsc commands,
// Sentry, gofer) under dir/<id>/. It is verbose and slows start-up; meant for
// diagnosing a misbehaving sandbox, not for production.
func WithDebugLog(dir string) Option { return func(d *Driver) { d.debugDir = dir } }

// WithPlatform selects runsc's --platform (default systrap; kvm needs a
// usable /dev/kvm).
func WithPlatform(p string) Option { return func(d *Driver) { d.platform = p } }

// WithOverlay sets runsc's --overlay2 (default "none", so writes reach the
// host upper dir). "root:self" keeps root filesystem writes in a gVisor file
// store instead: faster small-file I/O, but invisible to host snapshots.
func WithOverlay(v string) Option { return func(d *Driver) { d.overlay = v } }

// WithFileAccess sets runsc's --file-access for the root mount (default
// "exclusive": the Sentry may cache the root filesystem because nothing on
// the host modifies a running sandbox's rootfs). Use "shared" if something
// outside the sandbox writes into it while it runs.
func WithFileAccess(v string) Option { return func(d *Driver) { d.fileAccess = v } }

// WithRunscFlags appends extra global runsc flags, given to every runsc
// subcommand.
func WithRunscFlags(flags ...string) Option {
	return func(d *Driver) { d.extraFlags = append(d.extraFlags, flags...) }
}

// WithHostResolvConf sets the host resolv.conf the sandbox's nameservers are
// derived from (default /etc/resolv.conf).
func WithHostResolvConf(path string) Option { return func(d *Driver) { d.hostResolv = path } }

// New returns a Driver that runs the runsc binary at runscPath and keeps its
// state under stateDir, which it creates if needed.
func New(runscPath, stateDir string, opts ...Option) (*Driver, error) {
	if runscPath == "" || stateDir == "" {
		return nil, fmt.Errorf("new gvisor driver: runsc path and state dir are required: %w", errdefs.ErrInvalid)
	}
	if _, err := os.Stat(runscPath); err != nil {
		return nil, fmt.Errorf("new gvisor driver: runsc: %w", err)
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, fmt.Errorf("new gvisor driver: state dir: %w", err)
	}
	d := &Driver{
		runsc:      runscPath,
		stateDir:   abs,
		platform:   "systrap",
		overlay:    "none",
		fileAccess: "exclusive",
		hostResolv: "/etc/resolv.conf",

		runscTimeout: runscTimeout,
	}
	for _, o := range opts {
		o(d)
	}
	if err := os.MkdirAll(d.runscRoot(), 0o700); err != nil {
		return nil, fmt.Errorf("new gvisor driver: create state dir: %w", err)
	}
	return d, nil
}

// Close releases what runsc shares between sandboxes under the state dir:
// the empty network namespace it bind-mounts at runsc/null-netns for its
// gofers. Running sandboxes are unaffected (their gofers joined it long
// ago), and a later Start simply pins a new one, so Close is safe at any
// time; call it before removing the state dir, which fails (EBUSY) while
// the mount exists. Concurrent first starts may have stacked several
// mounts there, so all are removed.
func (d *Driver) Close() error {
	p := filepath.Join(d.runscRoot(), "null-netns")
	for unix.Unmount(p, unix.MNT_DETACH) == nil {
	}
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("close gvisor driver: %w", err)
	}
	return nil
}

// Name returns "gvisor".
func (d *Driver) Name() string { return Name }

func (d *Driver) runscRoot() string          { return filepath.Join(d.stateDir, "runsc") }
func (d *Driver) bundleDir(id string) string { return filepath.Join(d.stateDir, id) }

// Start writes the sandbox's OCI bundle and has runsc create and start it,
// detached: runsc runs in its own session and moves the sandbox into the
// cgroup /cubicle/<id>, so the sandbox outlives the daemon. On failure the
// error carries the tail of runsc's log and nothing of id remains.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) error {
	return d.launch(ctx, spec, "")
}

// launch is Start, or Restore when image (a checkpoint image dir) is set.
func (d *Driver) launch(ctx context.Context, spec runtime.Spec, image string) error {
	if err := runtime.ValidateSpec(spec); err != nil {
		return err
	}
	dir := d.bundleDir(spec.ID)
	if _, err := os.Stat(dir); err == nil {
		// A previous instance left state: refuse if it is alive, else
		// clear it so runsc does not report the id as taken.
		running, err := d.Running(ctx, spec.ID)
		if err != nil {
			return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
		}
		if running {
			return fmt.Errorf("start sandbox %s: already running: %w", spec.ID, errdefs.ErrConflict)
		}
		if err := d.Stop(ctx, spec.ID); err != nil {
			return fmt.Errorf("start sandbox %s: clear stale state: %w", spec.ID, err)
		}
	}

	var undo cleanup.Stack
	defer undo.Run(ctx)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("start sandbox %s: create bundle dir: %w", spec.ID, err)
	}
	undo.Push(func(context.Context) error { return os.RemoveAll(dir) })
	if image == "" {
		// A restored sandbox keeps the files its processes already read.
		resolv, err := runtime.ResolvConf(d.hostResolv)
		if err != nil {
			return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
		}
		if err := runtime.WriteNetFiles(ctx, spec.RootFS, spec.Hostname, resolv); err != nil {
			return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
		}
	}
	saved, err := checkpointSpec(image)
	if err != nil {
		return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	if saved != nil {
		spec.Docker = saved.Docker
	}
	if err := writeBundle(dir, spec, saved); err != nil {
		return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	if err := saveNetConfig(spec.NetNS, dir); err != nil {
		return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	undo.Push(func(context.Context) error { return restoreNetConfig(dir) })
	// runsc may have created part of the sandbox before failing.
	undo.Push(func(ctx context.Context) error { return d.destroy(ctx, spec.ID) })
	if err := d.runDetached(ctx, spec, dir, image); err != nil {
		return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	if spec.Limits.MemBytes > 0 {
		if err := raiseMemLimit(spec.ID, hostMemLimit(spec.Limits)); err != nil {
			return fmt.Errorf("start sandbox %s: %w", spec.ID, err)
		}
	}
	undo.Release()
	return nil
}

// runDetached runs `runsc run --detach`, which creates and starts the
// sandbox in one process and returns once PID 1 has been started.
//
// Stdio: stdin is a pipe holding the agent's token, already closed for
// writing (the agent reads it to EOF: see runtime.Spec.Token), and
// stdout/stderr go to console.log, a file rather than a pipe. The sandbox
// inherits these descriptors and keeps them for its whole life, so an
// output pipe would make cmd.Wait block until the sandbox exits and would
// give the agent EPIPE/SIGPIPE once the daemon is gone.
//
// With image set it runs `runsc restore --image-path image --detach`
// instead, which starts the sandbox from a checkpoint; the restored agent
// already has its token.
func (d *Driver) runDetached(ctx context.Context, spec runtime.Spec, dir, image string) error {
	stdin, err := runtime.TokenPipe(spec.Token)
	if err != nil {
		return err
	}
	defer stdin.Close()
	consolePath := filepath.Join(dir, consoleFile)
	console, err := os.OpenFile(consolePath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("create console log: %w", err)
	}
	defer console.Close()

	logPath := filepath.Join(dir, runscLog)
	args, verb := d.launchArgs(spec, dir, image)
	cmd, cancel := d.command(ctx, args...)
	defer cancel()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, console, console
	// Its own session: no signal aimed at the daemon's process group or
	// terminal reaches the sandbox. No Pdeathsig, deliberately.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w: %s", verb, err, failureReason(logPath, consolePath))
	}
	return nil
}

// launchArgs are runDetached's runsc arguments (after the global flags)
// and its subcommand.
func (d *Driver) launchArgs(spec runtime.Spec, dir, image string) (args []string, verb string) {
	args = []string{"--log", filepath.Join(dir, runscLog), "--log-format=text"}
	if d.debugDir != "" {
		args = append(args, "--debug", "--debug-log", filepath.Join(d.debugDir, spec.ID)+"/")
	} else {
		// The Sentry's and the gofer's own logs at info level (a few
		// dozen lines each), which say why the sandbox ended (see
		// ExitCause); runsc names each file for its command.
		args = append(args, "--debug-log", filepath.Join(dir, "%COMMAND%.log"), "--debug-command=boot,gofer")
	}
	if spec.Docker {
		// Sandbox-wide settings the Sentry takes at boot (and a restore
		// again); the later subcommands (state, kill, checkpoint) talk
		// to it and need not repeat them.
		args = append(args, dockerFlags...)
	}
	verb = "run"
	if image != "" {
		verb = "restore"
		args = append(args, verb, "--image-path", image)
	} else {
		args = append(args, verb)
	}
	return append(args, "--detach", "--pid-file", filepath.Join(dir, pidFile), "--bundle", dir, spec.ID), verb
}

// Stop kills every process of sandbox id, gives its netns back the
// configuration runsc took over (see netns.go), and deletes runsc's state
// and the bundle directory. It is idempotent: an unknown or already dead id is fine.
func (d *Driver) Stop(ctx context.Context, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("stop sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if err := d.destroy(ctx, id); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	if err := restoreNetConfig(d.bundleDir(id)); err != nil {
		return fmt.Errorf("stop sandbox %s: give the netns back: %w", id, err)
	}
	if err := os.RemoveAll(d.bundleDir(id)); err != nil {
		return fmt.Errorf("stop sandbox %s: remove state: %w", id, err)
	}
	return nil
}

// destroy kills and deletes runsc's container id, tolerating an id runsc
// does not know, then makes sure no process or cgroup of id survives. The
// kill is best effort: delete --force kills the sandbox anyway, the kill
// only makes processes die before their sandbox does, and a sandbox that
// Suspend ended has none left.
func (d *Driver) destroy(ctx context.Context, id string) error {
	if _, err := os.Stat(filepath.Join(d.bundleDir(id), suspendedFile)); err != nil {
		_, _ = d.run(ctx, "kill", "--all", id, "KILL")
	}
	if _, err := d.run(ctx, "delete", "--force", id); err != nil && !isNotExist(err) {
		return err
	}
	return removeCgroups(id)
}

// containerState is the part of `runsc state`'s JSON the driver reads.
type containerState struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Pid    int    `json:"pid"`
}

// Running reports whether sandbox id's PID 1 is alive (running or paused), asking runsc (so it
// works for sandboxes started by an earlier daemon). An unknown id is simply
// not running. A sandbox whose Sentry was killed (e.g. by the host OOM
// killer) is reported stopped.
func (d *Driver) Running(ctx context.Context, id string) (bool, error) {
	pid, err := d.PID(ctx, id)
	return pid > 0, err
}

// PID returns the Sentry's host pid while sandbox id is alive (running or
// paused), else 0.
func (d *Driver) PID(ctx context.Context, id string) (int, error) {
	if !idPattern.MatchString(id) {
		return 0, fmt.Errorf("sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	if pid, ok := d.pidFromFile(id); ok {
		return pid, nil
	}
	out, err := d.run(ctx, "state", id)
	if err != nil {
		if isNotExist(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("state of sandbox %s: %w", id, err)
	}
	var st containerState
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, fmt.Errorf("state of sandbox %s: decode %q: %w", id, out, err)
	}
	// A paused sandbox (frozen for a snapshot) is alive too: recovery must
	// adopt it, not discard it.
	if st.Status != "running" && st.Status != "paused" {
		return 0, nil
	}
	return st.Pid, nil
}

// pidFromFile answers PID without a runsc subprocess (~10 ms, on every
// boot's watcher) from the pid runsc wrote at start: the process is the
// sandbox's while it lives with argv[0] runsc-sandbox and this bundle on
// its command line (a reused pid has neither), else the sandbox is gone.
// ok is false when there is no pid file (a sandbox started by an older
// daemon): ask runsc.
func (d *Driver) pidFromFile(id string) (pid int, ok bool) {
	b, err := os.ReadFile(filepath.Join(d.bundleDir(id), pidFile))
	if err != nil {
		return 0, false
	}
	pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, false
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, true // exited
	}
	args := strings.Split(string(cmdline), "\x00")
	if args[0] != "runsc-sandbox" || !slices.Contains(args, "--bundle="+d.bundleDir(id)) {
		return 0, true // the pid is another process's now
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && zombie(st) {
		return 0, true
	}
	return pid, true
}

// zombie reports whether /proc/<pid>/stat content st is of a process that
// exited and awaits its reaper.
func zombie(st []byte) bool {
	i := bytes.LastIndexByte(st, ')')
	return i >= 0 && i+2 < len(st) && st[i+2] == 'Z'
}

var _ runtime.Prober = (*Driver)(nil)

// Probe reports whether runsc and the state directory are still usable:
// a runsc binary that was removed or lost its execute bit, or a state
// directory that is gone or read-only, stops every future start.
func (d *Driver) Probe(context.Context) error {
	st, err := os.Stat(d.runsc)
	if err != nil {
		return fmt.Errorf("runsc: %w", err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("runsc %s is not an executable file (%v)", d.runsc, st.Mode())
	}
	if err := unix.Access(d.runscRoot(), unix.W_OK); err != nil {
		return fmt.Errorf("runsc state dir %s: %w", d.runscRoot(), err)
	}
	return nil
}

var _ runtime.Lister = (*Driver)(nil)

// List implements runtime.Lister: the ids with a bundle dir (runsc's own
// state dir, runsc/, does not match the id shape).
func (d *Driver) List(context.Context) ([]string, error) {
	return runtime.ListStateDirs(d.stateDir, idPattern)
}

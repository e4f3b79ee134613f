// Package runtime defines the seam between the sandbox manager and the
// isolation technology that actually runs a sandbox.
//
// A Driver starts the in-sandbox agent as PID 1 inside an isolation boundary
// (gVisor's user-space kernel, Linux namespaces, or later a microVM) on a root
// filesystem and network namespace that the manager has already prepared. The
// driver owns nothing else: storage and network are set up and torn down by
// the manager, so every driver sees the same inputs.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// AgentMountPath is where the cubicle binary appears, read-only, inside every
// sandbox. PID 1 is AgentMountPath with the arguments "agent".
const AgentMountPath = "/.cubicle/cubicle"

// Limits are resource bounds enforced by the driver (cgroups or equivalent).
// A zero field means "no limit beyond the host default".
type Limits struct {
	// MilliCPUs bounds CPU time: 1000 is one full core.
	MilliCPUs int64
	// MemBytes bounds memory; exceeding it gets processes OOM-killed.
	MemBytes int64
	// PidsMax bounds the number of tasks (fork-bomb protection); see Tasks
	// for the bound drivers actually enforce.
	PidsMax int64
	// Background boots the sandbox at the lowest CPU share (cgroup v1
	// cpu.shares 2, v2 cpu.weight 1): it gets CPU only when nothing else
	// wants it. Warm-pool instances run so until a claim gives them the
	// normal share (CPUWeighter).
	Background bool
}

// Sizing of the bounds derived from MemBytes, shared by every driver so a
// sandbox behaves the same whatever runs it.
const (
	// TaskBytes is the memory a sandbox is assumed to spend per task. A
	// forked shell holds 0.1-0.4 MiB of its own pages; under gVisor every
	// task also costs the host about 0.55 MiB outside the sandbox's own
	// accounting (systrap stubs, Sentry state; measured: 500 sleepers
	// raised the host cgroup by 267 MiB while /proc/meminfo inside rose by
	// 48 MiB). One task per MiB keeps a fork bomb's memory well inside
	// the limit, so it runs out of tasks (EAGAIN), not memory.
	TaskBytes = 1 << 20
	// MinTasks is the task bound of the smallest sandboxes.
	MinTasks = 64
	// DefaultTmpfsBytes sizes tmpfs mounts of a sandbox without a memory
	// limit.
	DefaultTmpfsBytes = 64 << 20
)

// Tasks is the number of tasks (processes and threads) the driver lets the
// sandbox have: PidsMax, lowered to one per TaskBytes of MemBytes (at least
// MinTasks). Zero means no bound.
func (l Limits) Tasks() int64 {
	n := l.PidsMax
	if l.MemBytes > 0 {
		byMem := max(l.MemBytes/TaskBytes, MinTasks)
		if n <= 0 || byMem < n {
			n = byMem
		}
	}
	return n
}

// TmpfsBytes is the size of each writable tmpfs the driver mounts (/tmp
// where it is one, /dev/shm): a quarter of MemBytes. tmpfs pages are memory
// that no kill frees, so unsized mounts let one `dd` fill the sandbox's
// memory and get the whole sandbox killed; at a quarter each, filling them
// all fails with ENOSPC and leaves half of the memory to processes.
func (l Limits) TmpfsBytes() int64 {
	if l.MemBytes <= 0 {
		return DefaultTmpfsBytes
	}
	return l.MemBytes / 4
}

// Spec describes one sandbox instance to start.
type Spec struct {
	// ID is the sandbox's fixed-length (32 lowercase hex) id. Drivers use it
	// as their container id; fixed length avoids runsc's prefix matching.
	ID string
	// RootFS is the host path of the already-mounted root filesystem.
	RootFS string
	// AgentBinary is the host path of the cubicle binary, bound read-only at
	// AgentMountPath.
	AgentBinary string
	// Env is the environment of PID 1 (the agent). Root inside the sandbox
	// can read it (/proc/1/environ): never put a secret there.
	Env []string
	// Token is the agent's token. Drivers write it into a pipe that
	// becomes PID 1's standard input and close it before the agent runs
	// (see agent.ReadToken), so it is never in the environment, argv or a
	// file of the sandbox.
	Token string
	// Hostname is the sandbox's UTS hostname.
	Hostname string
	// NetNS is the path of a network namespace (bind-mounted nsfs file) that
	// the sandbox joins. The manager has configured its interfaces.
	NetNS string
	// Limits are enforced by the driver.
	Limits Limits
	// Mounts are host directories bound into the sandbox (volumes, data
	// mounts the daemon serves), in order; see ValidateMounts.
	Mounts []Mount
	// Docker runs the sandbox with what a container engine (dockerd,
	// containerd, runc) needs inside it. Only drivers implementing
	// DockerHost accept it; the others refuse it with ErrInvalid.
	Docker bool
}

// Mount binds host directory Source at Target inside the sandbox. Files
// keep their host owners as the root filesystem's upper dir does (host
// uid 0 is root inside), and the mount is nosuid and nodev. Source is
// always a directory the daemon made; never a path a tenant named.
type Mount struct {
	Source   string
	Target   string
	ReadOnly bool
}

// reservedTargets are paths a Mount may not cover or sit under: the
// kernel interfaces and the agent, which the driver mounts itself.
var reservedTargets = [...]string{"/proc", "/sys", "/dev", path.Dir(AgentMountPath)}

// ValidateMounts checks that every target is an absolute, clean path other
// than "/" outside the reserved trees, that no two targets are the same,
// and that every source is an existing directory.
func ValidateMounts(ms []Mount) error {
	seen := map[string]bool{}
	for _, m := range ms {
		t := m.Target
		if err := ValidateTarget(t); err != nil {
			return fmt.Errorf("mount target %q: %w", t, err)
		}
		if seen[t] {
			return fmt.Errorf("mount target %q: given twice", t)
		}
		seen[t] = true
		if fi, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("mount source for %s: %w", t, err)
		} else if !fi.IsDir() {
			return fmt.Errorf("mount source for %s: %s is not a directory", t, m.Source)
		}
	}
	return nil
}

// IDPattern is the id shape drivers that name host state by it accept
// (Spec.ID): fixed length, so runsc's prefix matching never picks the
// wrong container.
var IDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)

// ValidateSpec checks what Start needs from spec before touching
// anything: an IDPattern id, absolute existing rootfs, agent binary and
// netns paths, and valid mounts. Its errors are ErrInvalid.
func ValidateSpec(spec Spec) error {
	if !IDPattern.MatchString(spec.ID) {
		return fmt.Errorf("start sandbox %q: id must be 32 lowercase hex digits: %w", spec.ID, errdefs.ErrInvalid)
	}
	for what, p := range map[string]string{"rootfs": spec.RootFS, "agent binary": spec.AgentBinary, "network namespace": spec.NetNS} {
		if p == "" || !filepath.IsAbs(p) {
			return fmt.Errorf("start sandbox %s: %s path %q must be absolute: %w", spec.ID, what, p, errdefs.ErrInvalid)
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("start sandbox %s: %s: %w: %w", spec.ID, what, errdefs.ErrInvalid, err)
		}
	}
	if err := ValidateMounts(spec.Mounts); err != nil {
		return fmt.Errorf("start sandbox %s: %w: %w", spec.ID, errdefs.ErrInvalid, err)
	}
	return nil
}

// TargetsOverlap reports whether mount targets a and b are the same path
// or one is under the other (one bind would shadow the other).
func TargetsOverlap(a, b string) bool {
	return a == b || strings.HasPrefix(a, b+"/") || strings.HasPrefix(b, a+"/")
}

// ValidateTarget checks one mount target: an absolute, clean path other
// than "/" outside the reserved trees (callers check targets this way
// before any sandbox starts, to name the field at fault).
func ValidateTarget(t string) error {
	if !path.IsAbs(t) || path.Clean(t) != t || t == "/" {
		return errors.New("must be an absolute clean path other than /")
	}
	for _, r := range reservedTargets {
		if t == r || strings.HasPrefix(t, r+"/") {
			return fmt.Errorf("%s is the runtime's own", r)
		}
	}
	return nil
}

// DockerHost is implemented by drivers that can run Docker inside a
// sandbox (Spec.Docker) without widening what the host kernel exposes to
// it. The manager refuses the opt-in on drivers without it.
type DockerHost interface {
	// DockerInside returns what the opt-in adds to the sandbox, which the
	// daemon logs at start so an operator sees what it grants.
	DockerInside() string
}

// Driver runs sandboxes. Implementations must be safe for concurrent use on
// different ids, and must keep instances alive when the daemon exits, so that
// a restarted daemon can re-adopt them (Running reports them).
type Driver interface {
	// Name is the driver's identifier as given to --runtime.
	Name() string
	// Start launches the agent as PID 1 and returns once it is started
	// (the caller waits for the agent to answer). On error nothing is left
	// running and no driver state remains for spec.ID.
	Start(ctx context.Context, spec Spec) error
	// Stop kills every process of the sandbox and removes the driver's
	// state for id. The root filesystem is left untouched. Stopping an id
	// that is not running is not an error.
	Stop(ctx context.Context, id string) error
	// Running reports whether the sandbox id is alive (used on recovery).
	Running(ctx context.Context, id string) (bool, error)
	// PID returns the host process whose exit means the sandbox is gone
	// (gVisor's Sentry, the namespace sandbox's PID 1, a VMM), or 0 when
	// id is not running. The manager watches it to notice sandboxes that
	// die on their own, e.g. killed for exceeding their memory limit.
	PID(ctx context.Context, id string) (int, error)
}

// Accelerated is implemented by drivers whose sandboxes run on an
// accelerator chosen at start (the microVM driver's kvm or tcg); /healthz
// and cubicle info report it.
type Accelerated interface {
	Accel() string
}

// Prober is implemented by drivers that depend on something outside the
// daemon that can go missing (a runtime binary, its state directory); the
// daemon's health check calls Probe, which returns why new sandboxes could
// not start, or nil.
type Prober interface {
	Probe(ctx context.Context) error
}

// Lister is implemented by drivers that keep per-sandbox state on the
// host: List returns the ids that hold any (running or not), so the daemon
// can stop instances of sandboxes it has no record of.
type Lister interface {
	List(ctx context.Context) ([]string, error)
}

// Explainer is implemented by drivers that can tell, from what they keep on
// the host, why a sandbox that died on its own went (which of its
// processes died first), for its status message. ExitCause returns "" when
// it cannot tell; call it before Stop, which removes that state.
type Explainer interface {
	ExitCause(id string) string
}

// Checkpointer is implemented by drivers that can save a running sandbox's
// memory and kernel state (processes, open files, sockets, timers) to disk
// and start new sandboxes from that image, which resume where the source
// was. It is optional: the manager answers memory-snapshot requests with
// "not supported" on drivers without it. Drivers implementing it also
// implement Pauser.
type Checkpointer interface {
	// Checkpoint saves sandbox id's memory image into dir (an existing,
	// empty directory). It returns with the sandbox paused, as Pauser.Pause
	// leaves it, so the caller can capture the filesystem at the same
	// instant; the caller must then call Pauser.Resume, also on error.
	Checkpoint(ctx context.Context, id, dir string) error
	// Suspend is Checkpoint for a sandbox about to stop: the save ends the
	// sandbox instead of leaving it paused (no pause before it, no kill of
	// its processes after), which is what a memory-preserving stop costs.
	// The caller then calls Stop, also on error.
	Suspend(ctx context.Context, id, dir string) error
	// Restore is Start, except that the sandbox resumes from the image in
	// dir (written by Checkpoint) instead of booting: PID 1 is not started
	// again. spec.RootFS must show the same files the source's rootfs
	// showed at the checkpoint; spec.NetNS may differ (another address).
	// The restored processes keep the environment they had, so spec.Env
	// and spec.Token are ignored (the agent holds the source's token until
	// the caller replaces it); the UTS hostname is the source's too.
	Restore(ctx context.Context, spec Spec, dir string) error
}

// AgentDialer is a Driver that carries the agent's API over its own
// transport (the microVM's virtio-serial port) instead of TCP to the
// sandbox's address. The daemon's agent client dials through it; the
// agent then listens on no network address at all.
type AgentDialer interface {
	// DialAgent opens a connection to the agent of sandbox id, which
	// may still be booting (the dial then waits within ctx).
	DialAgent(ctx context.Context, id string) (net.Conn, error)
}

// TokenPipe returns the read end of a pipe holding token and nothing more
// (the write end is closed), to become the agent's standard input. The
// token fits the pipe's buffer, so nothing has to wait for a reader.
func TokenPipe(token string) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("token pipe: %w", err)
	}
	_, err = w.WriteString(token)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("token pipe: %w", err)
	}
	return r, nil
}

// ListStateDirs returns the names of dir's subdirectories that match id,
// sorted: the per-sandbox state of drivers that keep one directory per id.
// A missing dir holds none.
func ListStateDirs(dir string, id *regexp.Regexp) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list runtime state in %s: %w", dir, err)
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && id.MatchString(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil // ReadDir sorts by name
}

// DefaultEnv is env with PATH and HOME added where it lacks them: the
// agent's environment on every driver that starts it itself.
func DefaultEnv(env []string) []string {
	defaults := map[string]string{
		"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": "/root",
	}
	out := append([]string(nil), env...)
	for k, v := range defaults {
		found := false
		for _, e := range env {
			if strings.HasPrefix(e, k+"=") {
				found = true
				break
			}
		}
		if !found {
			out = append(out, k+"="+v)
		}
	}
	return out
}

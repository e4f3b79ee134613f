package namespace

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/cleanup"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/runtime/userns"
)

// Start implements runtime.Driver. It returns once the agent has been exec'd
// as PID 1; on error nothing is left running and stateDir/<id> is removed.
func (d *Driver) Start(ctx context.Context, spec runtime.Spec) (err error) {
	if err := validID(spec.ID); err != nil {
		return err
	}
	if spec.RootFS == "" || spec.AgentBinary == "" || spec.NetNS == "" {
		return fmt.Errorf("start %s: rootfs, agent binary and netns are required: %w", spec.ID, errdefs.ErrInvalid)
	}
	if err := runtime.ValidateMounts(spec.Mounts); err != nil {
		return fmt.Errorf("start %s: %w: %w", spec.ID, errdefs.ErrInvalid, err)
	}
	if spec.Docker {
		// Docker inside would need the host kernel's own CAP_SYS_ADMIN
		// and overlay mounts: no longer a sandbox.
		return fmt.Errorf("start %s: the namespace runtime cannot run Docker inside a sandbox: %w", spec.ID, errdefs.ErrInvalid)
	}
	if ok, err := d.Running(ctx, spec.ID); err != nil || ok {
		if err == nil {
			err = errdefs.ErrConflict
		}
		return fmt.Errorf("start %s: already running: %w", spec.ID, err)
	}
	// A dead sandbox's leftovers (daemon crash) must not leak into this one.
	if err := d.Stop(ctx, spec.ID); err != nil {
		return err
	}

	var undo cleanup.Stack
	defer undo.Run(ctx)
	dir := d.dir(spec.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	undo.Push(func(context.Context) error { return os.RemoveAll(dir) })

	resolv, err := runtime.ResolvConf(d.resolvConf)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if err := runtime.WriteNetFiles(ctx, spec.RootFS, spec.Hostname, resolv); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}

	cg := d.cgroupsFor(spec.ID)
	undo.Push(func(ctx context.Context) error { return cg.remove(ctx) })
	if err := cg.create(spec.Limits); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}

	usernsFD, err := d.userns()
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	mounts, err := d.hostMounts(spec, usernsFD)
	defer mounts.close()
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	cfg := initConfig{Hostname: spec.Hostname, Env: spec.Env, Mounts: mounts.targets,
		SysFD: firstMountFD + len(mounts.files), // appended by spawn
		Token: spec.Token, ShmBytes: spec.Limits.TmpfsBytes()}

	owner, err := d.allocOwner(spec.ID)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	cmd, pipes, err := d.spawn(spec, mounts.files, owner)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	defer pipes.close()
	undo.Push(func(context.Context) error {
		cmd.Process.Kill()
		return cmd.Wait()
	})
	pid := cmd.Process.Pid

	// PID 1 waits on its config pipe: join the cgroups before it runs anything.
	if err := cg.add(pid); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if cfg.CPUInfo, err = pinCPUs(pid, spec); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if err := json.NewEncoder(pipes.config).Encode(cfg); err != nil {
		return fmt.Errorf("start %s: send init config: %w", spec.ID, err)
	}
	pipes.config.Close()
	if err := waitExec(ctx, pipes.status); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	st, err := runtime.ProcessOf(pid)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	if err := d.writeState(spec.ID, st); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	// Reap PID 1 while this process lives; after a daemon exit, the
	// sandbox is re-parented and reaped by the host's init.
	go cmd.Wait()
	undo.Release()
	return nil
}

// initPipes are the daemon's ends of the pipes to a starting init.
type initPipes struct {
	config *os.File // write end of fd 3: config, and the go-ahead on EOF
	status *os.File // read end of fd 4: error text, or EOF on exec
}

func (p initPipes) close() {
	p.config.Close()
	p.status.Close()
}

// spawn forks the init binary into new namespaces, from a thread that has
// joined spec.NetNS (a forked child inherits the forking thread's netns) and
// taken owner as its effective uid (the new user namespace's owner, see
// allocOwner), and writes the namespace's id maps.
func (d *Driver) spawn(spec runtime.Spec, mounts []*os.File, owner int) (*exec.Cmd, initPipes, error) {
	var p initPipes
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, p, err
	}
	defer cfgR.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		cfgW.Close()
		return nil, p, err
	}
	defer stW.Close()
	p = initPipes{config: cfgW, status: stR}
	log, err := os.OpenFile(filepath.Join(d.dir(spec.ID), "init.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		p.close()
		return nil, initPipes{}, err
	}
	defer log.Close()
	last, err := lastCap()
	if err != nil {
		p.close()
		return nil, initPipes{}, err
	}
	ambient := make([]uintptr, last+1)
	for c := range ambient {
		ambient[c] = uintptr(c)
	}

	cmd := &exec.Cmd{
		Path:       d.initPath,
		Args:       []string{d.initPath, InitArg},
		Env:        []string{},
		Stdout:     log,
		Stderr:     log,
		ExtraFiles: append([]*os.File{cfgR, stW}, mounts...), // fds 3, 4, 5...
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true,
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
				unix.CLONE_NEWUTS | unix.CLONE_NEWIPC,
			// Init execs as the owner, unmapped until writeIDMaps and
			// so not root: ambient capabilities carry its caps in the
			// new namespace across exec, until it becomes root there.
			AmbientCaps: ambient,
		},
	}
	// sysfs shows the network devices of the netns it is mounted from, so
	// it is made here, on the thread that joined the sandbox's netns.
	sysfs := func() error {
		fd, err := userns.NewFS("sysfs", map[string]string{"source": "sysfs"}, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "sysfs")
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		return nil
	}
	defer func() {
		if n := len(cmd.ExtraFiles); n > 2+len(mounts) {
			cmd.ExtraFiles[n-1].Close()
		}
	}()
	if err := startInNetns(cmd, spec.NetNS, sysfs, owner); err != nil {
		p.close()
		return nil, initPipes{}, err
	}
	if err := writeIDMaps(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		p.close()
		return nil, initPipes{}, err
	}
	return cmd, p, nil
}

// startInNetns starts cmd as owner (see startAs) from a locked OS thread
// switched to netnsPath, after running prepare on that thread as root.
func startInNetns(cmd *exec.Cmd, netnsPath string, prepare func() error, owner int) error {
	target, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns: %w", err)
	}
	defer unix.Close(target)
	goruntime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("open own netns: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		goruntime.UnlockOSThread()
		return fmt.Errorf("join netns %s: %w", netnsPath, err)
	}
	startErr := prepare()
	if startErr == nil {
		var reusable bool
		if reusable, startErr = startAs(owner, cmd.Start); !reusable {
			if cmd.Process != nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
			return startErr // the thread stays locked, and is discarded
		}
	}
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: the runtime discards it when this
		// goroutine exits instead of reusing it in the wrong netns.
		if startErr == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		return fmt.Errorf("restore netns: %w", err)
	}
	goruntime.UnlockOSThread()
	if startErr != nil {
		return fmt.Errorf("start init: %w", startErr)
	}
	return nil
}

// waitExec reads the init's status pipe: EOF alone means the agent was
// exec'd (the write end is close-on-exec), anything else is init's error.
func waitExec(ctx context.Context, status *os.File) error {
	type result struct {
		b   []byte
		err error
	}
	ch := make(chan result, 1)
	go func() {
		b, err := io.ReadAll(status)
		ch <- result{b, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("read init status: %w", r.err)
		}
		if len(r.b) > 0 {
			return fmt.Errorf("sandbox init: %s", bytes.TrimSpace(r.b))
		}
		return nil
	case <-ctx.Done():
		status.Close() // unblocks the reader
		return fmt.Errorf("waiting for sandbox init: %w", ctx.Err())
	}
}

// pinCPUs gives PID 1 (before it runs anything) the CPUs of runtime.CPUs,
// so nproc inside says the sandbox's vCPUs; every process inherits them.
// The thread of tid pid is the one that execs the agent. Unlike a cpuset
// cgroup, a process may widen its own affinity again: that changes what
// it is told, not what it gets (the CFS quota bounds its CPU time).
// It returns the /proc/cpuinfo of those CPUs for init to show, or "" when
// the sandbox runs on every CPU.
func pinCPUs(pid int, spec runtime.Spec) (string, error) {
	allowed, err := runtime.AllowedCPUs()
	if err != nil {
		return "", fmt.Errorf("read CPU affinity: %w", err)
	}
	cpus := runtime.CPUs(spec.ID, spec.Limits, allowed)
	if cpus == nil {
		return "", nil
	}
	host, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", err
	}
	info, err := cpuInfo(host, cpus)
	if err != nil {
		return "", err
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	if err := unix.SchedSetaffinity(pid, &set); err != nil {
		return "", fmt.Errorf("pin to CPUs %v: %w", cpus, err)
	}
	return string(info), nil
}

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// cgroupRoot is where the host's cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// cgroupDirs lists sandbox id's cgroup directories (cgroupsPath
// /cubicle/<id>) in every v1 hierarchy, or the single v2 one.
func cgroupDirs(id string) []string {
	v1, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", "cubicle", id))
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cubicle", id)); err == nil {
		v1 = append(v1, filepath.Join(cgroupRoot, "cubicle", id))
	}
	return v1
}

// hostTaskBytes is what one task of the sandbox costs the host beyond what
// the sandbox itself sees: systrap's stub process and thread, the Sentry's
// task state (measured: 0.55 MiB per sleeping task), rounded up.
const hostTaskBytes = 640 << 10

// hostMemLimit is the host memory cgroup limit of a sandbox with limits l.
// The sandbox's own limit (l.MemBytes) is enforced inside by the agent's
// OOM guard, which kills the biggest process the way the kernel would; the
// host limit is the backstop that kills the whole sandbox (Sentry
// included).
//
// The headroom covers what the Sentry and gofer use besides the sandbox's
// memory (about 25 MiB idle here); what every task costs the host outside
// the sandbox's accounting (hostTaskBytes for each of l.Tasks(), so a fork
// bomb runs into RLIMIT_NPROC before the host limit); and, mostly, memory
// committed inside one system call, which no poller can interrupt: reading
// 256 MiB from /dev/zero into a fresh buffer commits all of it before the
// guard's SIGKILL takes effect (the kernel, by contrast, charges page by
// page). 256 MiB plus a quarter of the limit lets such a single allocation
// of up to about 200 MiB beyond the limit end in a normal OOM kill; a
// bigger one still takes the whole sandbox down.
func hostMemLimit(l runtime.Limits) int64 {
	return l.MemBytes + 256<<20 + l.MemBytes/4 + l.Tasks()*hostTaskBytes
}

// raiseMemLimit sets sandbox id's host memory limit to limit. runsc is
// started with the sandbox's own limit, from which it sizes the sandbox
// (MemTotal in /proc/meminfo is the cgroup limit runsc sees at boot); the
// headroom is added once the sandbox is running.
func raiseMemLimit(id string, limit int64) error {
	v := strconv.FormatInt(limit, 10)
	for _, f := range []string{
		filepath.Join(cgroupRoot, "memory", "cubicle", id, "memory.limit_in_bytes"), // v1
		filepath.Join(cgroupRoot, "cubicle", id, "memory.max"),                      // v2
	} {
		if _, err := os.Stat(f); err != nil {
			continue
		}
		if err := os.WriteFile(f, []byte(v), 0o644); err != nil {
			return fmt.Errorf("raise host memory limit: %w", err)
		}
		return nil
	}
	return fmt.Errorf("raise host memory limit: no memory cgroup for sandbox %s", id)
}

// removeCgroups kills whatever is left in sandbox id's cgroups and removes
// them. runsc delete normally does this, but when the Sentry has died
// abruptly (host OOM kill) its gofer or stubs can outlive the delete and
// the cgroups are left behind. Every process there belongs to the sandbox.
func removeCgroups(id string) error {
	var errs []error
	for _, dir := range cgroupDirs(id) {
		var err error
		for try := 0; try < 50; try++ {
			killProcs(dir)
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// killProcs SIGKILLs every process listed in cgroup dir.
func killProcs(dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Usage implements runtime.Meter from the sandbox's host cgroups (runsc,
// Sentry and gofer included).
func (d *Driver) Usage(_ context.Context, id string) (runtime.Usage, error) {
	return runtime.CgroupUsage(cgroupRoot, filepath.Join("cubicle", id))
}

var _ runtime.CPUWeighter = (*Driver)(nil)

// SetBackground implements runtime.CPUWeighter on the sandbox's host cpu
// cgroup (runsc put the Sentry and gofer there).
func (d *Driver) SetBackground(_ context.Context, id string, background bool) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("set CPU share of sandbox %q: malformed id: %w", id, errdefs.ErrInvalid)
	}
	dir := filepath.Join(cgroupRoot, "cpu", "cubicle", id)
	if _, err := os.Stat(dir); err != nil {
		dir = filepath.Join(cgroupRoot, "cubicle", id)
	}
	if err := runtime.SetCgroupBackground(dir, background); err != nil {
		return fmt.Errorf("set CPU share of sandbox %s: %w", id, err)
	}
	return nil
}

package namespace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// cgroupControllers are the cgroup v1 hierarchies a sandbox gets a directory
// in: <root>/<ctrl>/<parent>/<id>. pids is listed first because Stop uses it
// to enumerate the sandbox's processes; freezer lets Pause stop them in place;
// cpuacct measures CPU time for Usage.
var cgroupControllers = [...]string{"pids", "memory", "cpu", "cpuacct", "freezer"}

// cgroups is one sandbox's set of cgroup v1 directories.
type cgroups struct {
	dirs []cgroupDir // one per controller present on the host
}

type cgroupDir struct{ ctrl, path string }

func (d *Driver) cgroupsFor(id string) cgroups {
	var cg cgroups
	for _, c := range cgroupControllers {
		base := filepath.Join(d.cgroupRoot, c)
		if _, err := os.Stat(filepath.Join(base, "cgroup.procs")); err != nil {
			continue
		}
		cg.dirs = append(cg.dirs, cgroupDir{c, filepath.Join(base, d.cgroupParent, id)})
	}
	return cg
}

// create makes the directories and writes the limits.
func (cg cgroups) create(l runtime.Limits) error {
	for _, cd := range cg.dirs {
		dir := cd.path
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup: %w", err)
		}
		var err error
		switch cd.ctrl {
		case "memory":
			if l.MemBytes > 0 {
				v := strconv.FormatInt(l.MemBytes, 10)
				err = writeFile(dir, "memory.limit_in_bytes", v)
				if err == nil && exists(dir, "memory.memsw.limit_in_bytes") {
					// memsw = limit: no swapping past the limit either.
					err = writeFile(dir, "memory.memsw.limit_in_bytes", v)
				}
			}
		case "pids":
			if n := l.Tasks(); n > 0 {
				err = writeFile(dir, "pids.max", strconv.FormatInt(n, 10))
			}
		case "cpu":
			if l.Background {
				err = runtime.SetCgroupBackground(dir, true)
			}
			if err == nil && l.MilliCPUs > 0 {
				const period = 100000
				err = writeFile(dir, "cpu.cfs_period_us", strconv.Itoa(period))
				if err == nil {
					err = writeFile(dir, "cpu.cfs_quota_us", strconv.FormatInt(l.MilliCPUs*period/1000, 10))
				}
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// add moves every thread of pid into the cgroups.
func (cg cgroups) add(pid int) error {
	for _, cd := range cg.dirs {
		if err := writeFile(cd.path, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// procs lists the pids in the sandbox's (first) cgroup.
func (cg cgroups) procs() []int {
	if len(cg.dirs) == 0 {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(cg.dirs[0].path, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids
}

// remove kills anything left in the cgroups and removes them, retrying while
// the kernel finishes tearing dying tasks down.
func (cg cgroups) remove(ctx context.Context) error {
	var errs []error
	for _, cd := range cg.dirs {
		if cd.ctrl == "freezer" {
			// A frozen task never dies of SIGKILL: thaw before killing.
			os.WriteFile(filepath.Join(cd.path, "freezer.state"), []byte("THAWED"), 0)
		}
	}
	for _, cd := range cg.dirs {
		dir := cd.path
		for {
			for _, p := range cg.procs() {
				unix.Kill(p, unix.SIGKILL)
			}
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dir, err))
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

func writeFile(dir, name, v string) error {
	if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0); err != nil {
		return fmt.Errorf("cgroup %s: %w", name, err)
	}
	return nil
}

func exists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// Usage implements runtime.Meter from the sandbox's cgroups.
func (d *Driver) Usage(_ context.Context, id string) (runtime.Usage, error) {
	return runtime.CgroupUsage(d.cgroupRoot, filepath.Join(d.cgroupParent, id))
}

var _ runtime.CPUWeighter = (*Driver)(nil)

// SetBackground implements runtime.CPUWeighter on the sandbox's cpu
// cgroup.
func (d *Driver) SetBackground(_ context.Context, id string, background bool) error {
	for _, cd := range d.cgroupsFor(id).dirs {
		if cd.ctrl == "cpu" {
			if err := runtime.SetCgroupBackground(cd.path, background); err != nil {
				return fmt.Errorf("set CPU share of sandbox %s: %w", id, err)
			}
			return nil
		}
	}
	return fmt.Errorf("set CPU share of sandbox %s: the host has no cpu cgroup", id)
}

package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
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

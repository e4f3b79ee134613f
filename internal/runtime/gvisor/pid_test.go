package gvisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestPIDFromFile: the pid runsc wrote is the sandbox's only while that
// process is the sandbox's (argv[0] runsc-sandbox, its bundle on the
// command line); no pid file means asking runsc.
func TestPIDFromFile(t *testing.T) {
	d := &Driver{stateDir: t.TempDir()}
	const id = "0123456789abcdef0123456789abcdef"
	if err := os.MkdirAll(d.bundleDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, ok := d.pidFromFile(id); ok {
		t.Fatal("answered without a pid file")
	}
	write := func(pid int) {
		if err := os.WriteFile(filepath.Join(d.bundleDir(id), pidFile), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sandbox := exec.Command("bash", "-c", `exec -a runsc-sandbox bash -c "sleep 30; true" --bundle=`+d.bundleDir(id))
	other := exec.Command("bash", "-c", `exec -a runsc-sandbox bash -c "sleep 30; true" --bundle=/elsewhere`)
	for _, c := range []*exec.Cmd{sandbox, other} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	}
	time.Sleep(100 * time.Millisecond) // both have exec'd
	write(sandbox.Process.Pid)
	if pid, ok := d.pidFromFile(id); !ok || pid != sandbox.Process.Pid {
		t.Fatalf("the sandbox's process: %d %v, want %d", pid, ok, sandbox.Process.Pid)
	}
	for what, pid := range map[string]int{"another sandbox's": other.Process.Pid, "this test's": os.Getpid()} {
		write(pid)
		if got, ok := d.pidFromFile(id); !ok || got != 0 {
			t.Errorf("%s process: %d %v, want 0 (gone)", what, got, ok)
		}
	}
	sandbox.Process.Kill()
	sandbox.Wait()
	write(sandbox.Process.Pid)
	if pid, ok := d.pidFromFile(id); !ok || pid != 0 {
		t.Fatalf("exited sandbox: %d %v, want 0", pid, ok)
	}
}
